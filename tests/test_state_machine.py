"""`state_machine.next_state`: the one transition rule, checked on its own."""

import doctest

import _model
import numpy as np
import pytest
import tensorflow as tf

from tf_lossscale.state_machine import next_state

F32_MAX = float(np.finfo(np.float32).max)


def _step(scale, good_steps, finite, period=3, multiplier=2.0, **kwargs):
    new_scale, new_steps = next_state(
        scale, good_steps, finite, period=period, multiplier=multiplier,
        **kwargs)
    assert new_scale.dtype == tf.float32 and new_steps.dtype == tf.int64
    return float(new_scale), int(new_steps)


def test_finite_step_below_period_counts_up():
    assert _step(8.0, 0, True) == (8.0, 1)
    assert _step(8.0, 1, True) == (8.0, 2)


def test_finite_step_reaching_period_grows_and_restarts_count():
    assert _step(8.0, 2, True) == (16.0, 0)


def test_period_one_grows_on_every_finite_step():
    assert _step(8.0, 0, True, period=1) == (16.0, 0)


def test_non_finite_step_backs_off_and_restarts_count():
    assert _step(8.0, 2, False) == (4.0, 0)


def test_back_off_never_goes_below_one():
    assert _step(1.5, 0, False) == (1.0, 0)
    assert _step(1.0, 0, False) == (1.0, 0)


def test_back_off_floor_is_min_scale():
    assert _step(8.0, 0, False, min_scale=6.0) == (6.0, 0)


def test_growth_that_would_overflow_keeps_scale_and_restarts_count():
    assert _step(3e38, 2, True) == (float(np.float32(3e38)), 0)


def test_growth_to_exactly_the_float32_maximum_is_kept():
    half_max = float(np.float32(F32_MAX) / np.float32(2))
    assert _step(half_max, 2, True) == (F32_MAX, 0)


def test_multiplier_is_rounded_to_float32_like_the_variable():
    # 1.1 is not a float32; the rule multiplies by float32(1.1), as the
    # float32 variable arithmetic of TensorFlow's class does.
    expected = float(np.float32(3.0) * np.float32(1.1))
    assert _step(3.0, 0, True, period=1, multiplier=1.1) == (expected, 0)
    assert expected != float(np.float32(3.0 * 1.1))


def test_next_state_traces_without_branches():
    fn = tf.function(lambda s, c, f: next_state(
        s, c, f, period=2, multiplier=2.0))
    graph = fn.get_concrete_function(
        tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.int64),
        tf.TensorSpec([], tf.bool)).graph
    op_types = {op.type for op in graph.get_operations()}
    assert not op_types & {"If", "StatelessIf", "Switch", "Merge"}
    assert "SelectV2" in op_types


@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
def test_next_state_in_tf_function_matches_the_model(jit_compile):
    fn = tf.function(
        lambda s, c, f, p, m: next_state(s, c, f, period=p, multiplier=m),
        jit_compile=jit_compile)
    flags = [True, True, False, True, True, True, False, False, False]
    model = _model.PythonLossScale(initial=3e38, period=2, multiplier=1.5)
    scale, steps = tf.constant(3e38), tf.constant(0, tf.int64)
    for flag in flags:
        scale, steps = fn(scale, steps, tf.constant(flag),
                          tf.constant(2, tf.int64), tf.constant(1.5))
        assert (float(scale), int(steps)) == model.step(flag)


def test_model_docstring_examples_hold():
    result = doctest.testmod(_model)
    assert result.attempted > 0 and result.failed == 0
