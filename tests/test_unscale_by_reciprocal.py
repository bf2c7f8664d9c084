"""Under XLA the update multiplies by the reciprocal when every scale is a
power of two: the same bits as dividing, and no quotient written out.

XLA writes out a division that two kernels read (Adam's moments) and
repeats a multiply. `state_machine.powers_of_two_only` says, from the
rule's numbers, whether every scale a step can see is a power of two;
then `finite_xla.apply_unscaled` multiplies, else it divides.
"""

from __future__ import annotations

import re
from typing import Any, List

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tf_lossscale
from tf_lossscale import _numerics, finite_xla, state_machine
from tf_lossscale.state_machine import Rule

SIZE = 64


@pytest.mark.parametrize("rule, start, expected", [
    (Rule(), 2.0**15, True),
    (None, 128, True),
    (None, 2.0**127, True),
    (Rule(min_scale=2.0**-126), 2.0**-20, True),
    (Rule(growth_factor=4.0, backoff_factor=0.25, max_scale=2.0**40),
     2.0**15, True),
    (None, 1000.0, False),
    (Rule(), 1000.0, False),
    (Rule(), 3 * 2.0**14, False),
    (Rule(growth_factor=3.0), 2.0**15, False),
    (Rule(backoff_divisor=3.0), 2.0**15, False),
    (Rule(backoff_factor=0.3), 2.0**15, False),
    (Rule(min_scale=0.75), 2.0**15, False),
    (Rule(max_scale=1e6), 2.0**15, False),
    (Rule(), tf.constant(2.0**15), False),
    (Rule(growth_factor=tf.constant(2.0)), 2.0**15, False),
    (None, True, False),
    (None, float("inf"), False),
])
def test_which_rules_keep_every_scale_a_power_of_two(rule, start, expected):
    assert state_machine.powers_of_two_only(rule, start) is expected


def _unscaled(dtype: tf.DType, by_reciprocal: bool) -> Any:
    @tf.function(jit_compile=True)
    def unscale(g: tf.Tensor, scale: tf.Tensor) -> tf.Tensor:
        out: List[tf.Tensor] = []
        finite_xla.apply_unscaled(out.extend, [g], scale, by_reciprocal)
        return out[0]
    return unscale


_COMPILED = {(d, r): _unscaled(d, r)
             for d in (tf.float32, tf.float16, tf.bfloat16)
             for r in (True, False)}


@tf.function
def _graph_divide(g: tf.Tensor, scale: tf.Tensor) -> tf.Tensor:
    return _numerics.divide(g, scale)


def _bits(t: tf.Tensor) -> np.ndarray:
    a = np.asarray(t.numpy())
    return a.view(np.uint32 if a.dtype == np.float32 else np.uint16)


# Mantissa and exponent drawn apart, so quotients land everywhere from
# overflow to subnormal and zero.
_VALUE = st.builds(
    lambda m, e, sign: np.float32(sign * m * 2.0**e),
    st.floats(1.0, 2.0, exclude_max=True, width=32),
    st.integers(-149, 127), st.sampled_from([1.0, -1.0])) | st.sampled_from(
        [np.float32(x) for x in (0.0, -0.0, np.inf, -np.inf, 3.4e38)])


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(_VALUE, min_size=SIZE, max_size=SIZE),
       exponent=st.integers(-126, 127),
       dtype=st.sampled_from([tf.float32, tf.float16, tf.bfloat16]))
def test_multiplying_by_the_reciprocal_gives_the_bits_of_the_division(
        values, exponent, dtype):
    g = tf.cast(tf.constant(np.array(values, np.float32)), dtype)
    scale = tf.constant(2.0**exponent, tf.float32)
    by_reciprocal = _COMPILED[dtype, True](g, scale)
    by_division = _COMPILED[dtype, False](g, scale)
    np.testing.assert_array_equal(_bits(by_reciprocal), _bits(by_division))
    np.testing.assert_array_equal(_bits(by_reciprocal),
                                  _bits(_graph_divide(g, scale)))


@pytest.mark.parametrize("exponent", [-126, -1, 0, 15, 126, 127])
def test_the_extreme_scales_are_exact(exponent):
    """2**127's reciprocal is subnormal, so it is applied in two normal
    factors; 2**-126 and 2**126 are the ends of the one-factor range."""
    tiny = np.float32(1.5 * 2.0**-100)
    g = tf.constant([3.0e38, -1.5e30, 2.0**100, 1.0, tiny, -0.0], tf.float32)
    scale = tf.constant(2.0**exponent, tf.float32)
    got = _COMPILED[tf.float32, True](g, scale).numpy()
    want = g.numpy().astype(np.float64) / 2.0**exponent
    with np.errstate(over="ignore"):
        want32 = want.astype(np.float32)
    # TensorFlow's CPU kernels flush subnormal results to zero.
    want32[np.abs(want) < 2.0**-126] = 0.0
    np.testing.assert_array_equal(got, want32)
    assert np.signbit(got[-1])


def _full_size_divides(hlo: str, shapes: List[str]) -> int:
    """How many `divide`s of a variable's shape the optimized HLO holds."""
    return sum(len(re.findall(rf"= f32\[{s}\]\S* divide\(", hlo))
               for s in shapes)


def _optimized_apply_hlo(optimizer: Any) -> str:
    variables = [tf.Variable(tf.ones([32, 16])), tf.Variable(tf.ones([16]))]
    optimizer.build(variables)

    @tf.function(jit_compile=True)
    def apply(g0: tf.Tensor, g1: tf.Tensor) -> None:
        optimizer.apply([g0, g1], variables)

    return apply.experimental_get_compiler_ir(
        tf.ones([32, 16]), tf.ones([16]))(stage="optimized_hlo")


def test_adam_under_xla_divides_no_gradient_when_scales_are_powers_of_two():
    """Adam divides once per variable itself (m / (sqrt(v) + epsilon)).
    With the default (power-of-two) scales ours adds no division of a
    gradient (its exact check divides only each gradient's largest
    magnitude); with a scale that is not one, the update divides each."""
    shapes = ["32,16", "16"]
    plain = _full_size_divides(
        _optimized_apply_hlo(keras.optimizers.Adam()), shapes)
    powers = _full_size_divides(_optimized_apply_hlo(
        tf_lossscale.LossScaleOptimizer(keras.optimizers.Adam())), shapes)
    other = _full_size_divides(_optimized_apply_hlo(
        tf_lossscale.LossScaleOptimizer(keras.optimizers.Adam(),
                                        initial_scale=1000.0)), shapes)
    assert plain == 2
    assert powers == plain
    assert other == plain + 2


@pytest.mark.parametrize("initial_scale", [2.0**127, 1000.0, 3 * 2.0**-20])
def test_an_adam_step_under_xla_is_the_step_on_the_divided_gradients(
        initial_scale):
    """One applied step, compiled whole, changes the variables and moments
    exactly as a plain Adam fed `g / scale` (computed by the graph path)."""
    grads = [tf.constant([[3.0e38, -2.0, 0.5], [1e-30, 7.0, -1e20]]) *
             (1.0 if initial_scale > 1 else 1e-30)]
    ours = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.Adam(1e-3), initial_scale=initial_scale,
        min_scale=2.0**-126)
    plain = keras.optimizers.Adam(1e-3)
    mine = [tf.Variable(tf.ones([2, 3]))]
    theirs = [tf.Variable(tf.ones([2, 3]))]
    ours.build(mine)
    plain.build(theirs)
    tf.function(lambda: ours.apply(grads, mine), jit_compile=True)()
    divided = [_graph_divide(g, tf.constant(initial_scale, tf.float32))
               for g in grads]
    plain.apply(divided, theirs)
    assert int(ours.iterations) == int(plain.iterations) == 1
    np.testing.assert_array_equal(mine[0].numpy(), theirs[0].numpy())
    for a, b in zip(ours.inner_optimizer.variables, plain.variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
