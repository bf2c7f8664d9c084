"""Property tests: `DynamicLossScale` against the plain-Python model.

Random step sequences and random `(initial_loss_scale, increment_period,
multiplier)`, including scales near the float32 maximum and multipliers that
float32 cannot represent; every state after every step must equal the
model's, bit for bit.
"""

import _model
import numpy as np
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from tf_lossscale import DynamicLossScale
from tf_lossscale.state_machine import next_state

F32_MAX = float(np.finfo(np.float32).max)

initial_scales = st.one_of(
    st.sampled_from([1.0, 2.0**15, 3e38, F32_MAX, 0.5, 7]),
    st.floats(min_value=1e-3, max_value=F32_MAX),
    st.integers(min_value=1, max_value=2**40))
periods = st.integers(min_value=1, max_value=6)
multipliers = st.one_of(
    st.sampled_from([2.0, 1.1, 3, 1e30]),
    # From the float32 just above 1: anything smaller rounds to 1 there.
    st.floats(min_value=1.0 + 2.0**-23, max_value=1e6))
step_flags = st.lists(st.booleans(), min_size=1, max_size=60)


@settings(deadline=None, max_examples=200)
@given(initial_scales, periods, multipliers, step_flags)
def test_every_eager_state_equals_the_model(initial, period, multiplier,
                                            flags):
    loss_scale = DynamicLossScale(initial, period, multiplier)
    model = _model.PythonLossScale(initial, period, multiplier)
    grads = {True: [tf.constant([1.0])], False: [tf.constant([np.nan])]}
    for flag in flags:
        _, should_apply = loss_scale.update(grads[flag])
        got = (bool(should_apply), float(loss_scale()),
               int(loss_scale.good_steps))
        assert got == (flag, *model.step(flag))


_traced_next_state = tf.function(
    lambda s, c, f, p, m: next_state(s, c, f, period=p, multiplier=m))


@settings(deadline=None, max_examples=200)
@given(initial_scales, periods, multipliers, step_flags)
def test_traced_next_state_equals_the_model(initial, period, multiplier,
                                            flags):
    model = _model.PythonLossScale(initial, period, multiplier)
    scale = tf.constant(initial, tf.float32)
    steps = tf.constant(0, tf.int64)
    period_t = tf.constant(period, tf.int64)
    multiplier_t = tf.constant(multiplier, tf.float32)
    for flag in flags:
        scale, steps = _traced_next_state(
            scale, steps, tf.constant(flag), period_t, multiplier_t)
        assert (float(scale), int(steps)) == model.step(flag)
