"""ParameterServerStrategy with a custom loop, for both Kerases.

Each run is a process of its own (tests/_parameter_server_case.py) holding
an in-process cluster: two workers and a parameter server on 127.0.0.1. A
step with a NaN gradient changes no variable and no momentum, halves the
scale and advances `iterations`; the finite steps around it apply as SGD
with momentum does.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

TESTS = Path(__file__).resolve().parent
CASE = TESTS / "_parameter_server_case.py"


def _run(flavour: str) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join(
                   [str(TESTS.parent)]
                   + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    env.pop("TF_USE_LEGACY_KERAS", None)
    done = subprocess.run([sys.executable, str(CASE), flavour], env=env,
                          capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("flavour, class_name", [
    ("keras3", "KerasLossScaleOptimizer"),
    ("tf_keras", "TfKerasLossScaleOptimizer"),
])
def test_nan_step_is_skipped_and_the_loop_goes_on(flavour, class_name):
    result = _run(flavour)
    assert result["class"] == class_name and result["workers"] == 2
    first, nan, third, fourth = result["trajectory"]
    # SGD(0.1, momentum=0.5) on gradient [1, 1]: velocity -0.1, then -0.15.
    np.testing.assert_allclose(first["var"], [0.9, 1.9], rtol=1e-6)
    assert first["scale"] == 1024.0
    # The NaN step: nothing applied, the scale halved, iterations advanced.
    assert nan["var"] == first["var"]
    assert nan["scale"] == 512.0 and nan["iterations"] == 2
    # The momentum was not touched by the skipped step: -0.1*0.5 - 0.1.
    np.testing.assert_allclose(third["var"], [0.75, 1.75], rtol=1e-6)
    # Two finite steps in a row after the back-off: the scale doubles.
    assert third["scale"] == 512.0 and fourth["scale"] == 1024.0
    assert fourth["iterations"] == 4 and result["skipped"] == 1
