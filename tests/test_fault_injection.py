"""2000-step runs with NaN, +Inf, -Inf and huge-but-finite gradients injected.

For each optimizer flavour (Keras 3 and TF1 here, tf_keras in a process of
its own with TF_USE_LEGACY_KERAS=1) and for float16 and float32 variables,
`tests/_fault_injection_driver.py` runs the plan and checks every step:
verdict and (scale, counter) equal the plain-Python model, a skipped step
changes no variable or slot, every step equals a plain inner optimizer fed
the unscaled gradients byte for byte, nothing becomes non-finite. The
summaries checked here prove that the runs did meet every kind of fault.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import _fault_injection_driver as driver
import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_lossscale import finite

TESTS = Path(__file__).resolve().parent
STEPS = 2000
DTYPES = ["float16", "float32"]


def assert_run_met_every_fault(summary, dtype):
    """The run was long, and every kind of fault happened and was handled.

    The scale also reached the top of its range: float16 gradients overflow
    by themselves once it passes 2**16, and float32 runs climb to 2**127,
    the largest power of two below the float32 maximum, without ever
    growing to inf.
    """
    assert summary["steps"] == STEPS
    for kind in driver.KINDS:
        assert summary[f"injected_{kind}"] >= 30, summary
    assert summary["skipped"] >= 90, summary
    assert summary["applied"] >= 1500, summary
    assert summary["applied_with_huge"] >= 5, summary
    assert summary["natural_overflows"] >= 1, summary
    assert summary["min_scale"] >= 1.0, summary
    top = {"float16": 2.0**16, "float32": 2.0**127}[dtype]
    assert summary["max_scale"] == top, summary


JIT = [pytest.param(False, id="graph"), pytest.param(True, id="xla")]


@pytest.mark.slow
@pytest.mark.parametrize("jit_compile", JIT)
@pytest.mark.parametrize("dtype", DTYPES)
def test_keras3_long_run_with_injected_faults_is_exact(dtype, jit_compile):
    assert_run_met_every_fault(
        driver.run_keras(keras, "keras3", dtype, STEPS, seed=0,
                         jit_compile=jit_compile), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_tf1_long_run_with_injected_faults_is_exact(dtype):
    assert_run_met_every_fault(driver.run_tf1(dtype, STEPS, seed=0), dtype)


@pytest.mark.slow
@pytest.mark.parametrize("jit_compile", JIT)
def test_tf_keras_long_run_with_injected_faults_is_exact(jit_compile):
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(
        [sys.executable, str(TESTS / "_fault_injection_driver.py"),
         "--flavour", "tf_keras", "--dtype", *DTYPES, "--steps", str(STEPS)]
        + (["--jit-compile"] if jit_compile else []),
        env=env, capture_output=True, text=True, timeout=900)
    output = result.stdout + result.stderr
    summaries = {}
    for line in result.stdout.splitlines():
        if line.startswith("SUMMARY "):
            _, dtype, payload = line.split(" ", 2)
            summaries[dtype] = json.loads(payload)
    failure = [line for line in output.splitlines()
               if line.startswith("AssertionError")]
    assert result.returncode == 0, failure or output[-5000:]
    assert set(summaries) == set(DTYPES), output[-5000:]
    for dtype, summary in summaries.items():
        assert_run_met_every_fault(summary, dtype)


@pytest.mark.parametrize("jit_compile", JIT)
def test_unscale_is_exact_at_the_largest_power_of_two_scale(jit_compile):
    """The long float32 runs reach a scale of 2**127, whose reciprocal is a
    float32 subnormal that TensorFlow's CPU kernels flush to zero; dividing
    by the scale instead is exact (also inside a caller XLA compiles whole,
    with the scale a constant there)."""
    scaled = tf.constant([1.5 * 2.0**127, -0.25 * 2.0**127], tf.float32)
    def unscale():
        return finite.unscale_and_check([scaled], tf.constant(2.0**127))
    if jit_compile:
        unscale = tf.function(unscale, jit_compile=True)
    unscaled, all_finite = unscale()
    assert bool(all_finite)
    np.testing.assert_array_equal(unscaled[0].numpy(), [1.5, -0.25])
