"""`FixedLossScale` and `DynamicLossScale`: trajectories and gradient inputs.

Each trajectory table (finite/non-finite steps in, the verdict, scale and
counter after every step out) runs in every execution mode through one
runner: eager, `tf.function`, `tf.function(jit_compile=True)` (XLA on CPU)
and a TF1 `Graph` + `Session`.
"""

import numpy as np
import pytest
import tensorflow as tf

import tf_lossscale
from tf_lossscale import DynamicLossScale, FixedLossScale

NAN, INF = float("nan"), float("inf")
F32_3E38 = float(np.float32(3e38))
MODES = ["eager", "function", "xla", "graph"]


def _grads(flag):
    """One step's gradient value: finite for True, NaN for False."""
    return np.array([1.0 if flag else NAN], np.float32)


def _good_steps(loss_scale):
    if isinstance(loss_scale, DynamicLossScale):
        return loss_scale.good_steps
    return None


def _record(should_apply, scale, good_steps):
    steps = None if good_steps is None else int(good_steps)
    return bool(should_apply), float(scale), steps


def _read(should_apply, loss_scale):
    return _record(should_apply, loss_scale(), _good_steps(loss_scale))


def _run_eager(make_loss_scale, flags):
    loss_scale = make_loss_scale()
    out = []
    for flag in flags:
        update_op, should_apply = loss_scale.update([_grads(flag)])
        assert update_op is None
        out.append(_read(should_apply, loss_scale))
    return out


def _run_function(make_loss_scale, flags, jit_compile=False):
    loss_scale = make_loss_scale()
    update = tf.function(lambda g: loss_scale.update([g])[1],
                         jit_compile=jit_compile)
    out = []
    for flag in flags:
        should_apply = update(tf.constant(_grads(flag)))
        out.append(_read(should_apply, loss_scale))
    return out


def _run_graph(make_loss_scale, flags):
    with tf.compat.v1.Graph().as_default(), tf.compat.v1.Session() as sess:
        loss_scale = make_loss_scale()
        grads = tf.compat.v1.placeholder(tf.float32, [1])
        update_op, should_apply = loss_scale.update([grads])
        # TensorFlow's types: an op for a fixed scale, a bool tensor for a
        # dynamic one.
        expected = (tf.Operation if isinstance(loss_scale, FixedLossScale)
                    else tf.Tensor)
        assert isinstance(update_op, expected)
        state = {"scale": loss_scale()}
        if _good_steps(loss_scale) is not None:
            state["steps"] = _good_steps(loss_scale)
        sess.run(tf.compat.v1.global_variables_initializer())
        out = []
        for flag in flags:
            fetches = {"op": update_op}
            if isinstance(should_apply, tf.Tensor):
                fetches["apply"] = should_apply
            ran = sess.run(fetches, {grads: _grads(flag)})
            values = sess.run(state)
            out.append(_record(ran.get("apply", should_apply),
                               values["scale"], values.get("steps")))
    return out


def run_updates(mode, make_loss_scale, flags):
    """`[(should_apply, scale, good_steps)]` after each step, in `mode`."""
    if mode == "eager":
        return _run_eager(make_loss_scale, flags)
    if mode in ("function", "xla"):
        return _run_function(make_loss_scale, flags, mode == "xla")
    return _run_graph(make_loss_scale, flags)


T, F = True, False

# name: (constructor args, flags, scales after each step, counts after each).
DYNAMIC_TRAJECTORIES = {
    "grows_every_period": (
        (1, 2, 2.0), [T, T, T, T, T, T],
        [1, 2, 2, 4, 4, 8], [1, 0, 1, 0, 1, 0]),
    "non_finite_backs_off_and_restarts_count": (
        (8, 3, 2.0), [T, T, F, T, T, T, F],
        [8, 8, 4, 4, 4, 8, 4], [1, 2, 0, 1, 2, 0, 0]),
    "never_below_one": (
        (4, 2, 2.0), [F, F, F, F, T],
        [2, 1, 1, 1, 1], [0, 0, 0, 0, 1]),
    "from_below_one_back_off_lifts_to_one": (
        (0.25, 5, 2.0), [F, T], [1, 1], [0, 1]),
    "period_one_multiplier_three": (
        (2, 1, 3.0), [T, T, F, T], [6, 18, 6, 18], [0, 0, 0, 0]),
    "never_grows_to_non_finite": (
        (3e38, 1, 2.0), [T, T, F, T, T],
        [F32_3E38, F32_3E38, 1.5e38, F32_3E38, F32_3E38], [0, 0, 0, 0, 0]),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(DYNAMIC_TRAJECTORIES))
def test_dynamic_loss_scale_trajectory(case, mode):
    args, flags, scales, counts = DYNAMIC_TRAJECTORIES[case]
    got = run_updates(mode, lambda: DynamicLossScale(*args), flags)
    expected = [(flag, float(np.float32(scale)), count)
                for flag, scale, count in zip(flags, scales, counts)]
    assert got == expected


@pytest.mark.parametrize("mode", MODES)
def test_fixed_loss_scale_trajectory_always_applies(mode):
    got = run_updates(mode, lambda: FixedLossScale(128), [T, F, T, F])
    assert got == [(True, 128.0, None)] * 4


@pytest.mark.parametrize("flags", [[T, T, F, T, T], [F, F, T, T, T]])
def test_dynamic_trajectory_equals_tensorflows_own_class(flags):
    args = dict(initial_loss_scale=3.0, increment_period=2, multiplier=1.1)
    ours = DynamicLossScale(**args)
    theirs = tf.compat.v1.mixed_precision.DynamicLossScale(**args)
    for flag in flags:
        grads = [tf.constant(_grads(flag))]
        assert bool(ours.update(grads)[1]) == bool(theirs.update(grads)[1])
        assert float(ours()) == float(theirs())


# Gradient inputs.


def _update_verdict(grads, loss_scale=None):
    loss_scale = loss_scale or DynamicLossScale(8, 2)
    update_op, should_apply = loss_scale.update(grads)
    assert update_op is None
    return bool(should_apply)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32",
                                   "float64"])
@pytest.mark.parametrize("bad", [NAN, INF, -INF], ids=["nan", "inf", "-inf"])
def test_non_finite_value_is_detected_in_every_float_dtype(dtype, bad):
    grad = tf.cast(tf.constant([1.0, bad, 2.0]), dtype)
    loss_scale = DynamicLossScale(8, 2)
    assert not _update_verdict([tf.ones([2], dtype), grad], loss_scale)
    assert float(loss_scale()) == 4.0


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32",
                                   "float64"])
def test_finite_gradients_apply_in_every_float_dtype(dtype):
    largest = float(np.finfo(np.float16).max) if dtype == "float16" else 3e38
    grad = tf.cast(tf.constant([largest, -largest, 0.0]), dtype)
    assert _update_verdict([grad])


def test_nan_deep_in_a_nested_structure_is_found():
    grads = {"a": [tf.ones([2]), None],
             "b": (None, {"c": tf.constant([[1.0], [NAN]])})}
    assert not _update_verdict(grads)


def test_nested_structure_all_finite_applies():
    grads = {"a": [tf.ones([2]), None], "b": (tf.zeros([3, 2], tf.float16),)}
    assert _update_verdict(grads)


@pytest.mark.parametrize("grads", [[], [None], [None, None]],
                         ids=["empty", "none", "nones"])
def test_no_gradient_tensor_counts_as_finite(grads):
    loss_scale = DynamicLossScale(8, 2)
    assert _update_verdict(grads, loss_scale)
    assert int(loss_scale.good_steps) == 1


def test_indexed_slices_are_checked_on_their_values():
    # No dense_shape: densifying the slices would fail, checking values works.
    bad = tf.IndexedSlices(tf.constant([[1.0], [NAN]]), tf.constant([0, 5]))
    good = tf.IndexedSlices(tf.constant([[1.0], [2.0]]), tf.constant([0, 5]))
    assert not _update_verdict([good, bad])
    assert _update_verdict([good, None])


def test_indexed_slices_checked_inside_tf_function():
    loss_scale = DynamicLossScale(8, 2)

    @tf.function
    def update(values):
        return loss_scale.update([tf.IndexedSlices(values, [0, 3], [4])])[1]

    assert not bool(update(tf.constant([1.0, INF])))
    assert bool(update(tf.constant([1.0, 2.0])))
    assert (float(loss_scale()), int(loss_scale.good_steps)) == (4.0, 1)


# Graph mode.


def test_graph_update_changes_nothing_until_its_op_runs():
    with tf.compat.v1.Graph().as_default(), tf.compat.v1.Session() as sess:
        loss_scale = DynamicLossScale(8, 2)
        update_op, should_apply = loss_scale.update([tf.constant([NAN])])
        scale, steps = loss_scale(), loss_scale.good_steps
        sess.run(tf.compat.v1.global_variables_initializer())
        assert sess.run([scale, steps]) == [8.0, 0]
        assert not sess.run(should_apply)  # The verdict alone changes nothing.
        assert sess.run([scale, steps]) == [8.0, 0]
        sess.run(update_op)
        assert sess.run([scale, steps]) == [4.0, 0]


def test_graph_variables_initialise_with_global_variables_initializer():
    with tf.compat.v1.Graph().as_default(), tf.compat.v1.Session() as sess:
        loss_scale = DynamicLossScale(8, 2)
        names = sorted(v.name for v in tf.compat.v1.global_variables())
        assert names == ["current_loss_scale:0", "good_steps:0"]
        assert not tf.compat.v1.trainable_variables()
        with pytest.raises(tf.errors.FailedPreconditionError):
            sess.run(loss_scale())
        sess.run(tf.compat.v1.global_variables_initializer())
        assert sess.run(loss_scale()) == 8.0


def test_fixed_update_in_graph_returns_an_op_and_true():
    with tf.compat.v1.Graph().as_default():
        update_op, should_apply = FixedLossScale(4).update([tf.constant(NAN)])
        assert isinstance(update_op, tf.Operation)
        assert should_apply is True


# The object itself.


def test_eager_fixed_update_returns_none_and_true():
    assert FixedLossScale(4).update([tf.constant(NAN)]) == (None, True)


def test_call_returns_a_float32_scalar_tensor():
    for loss_scale in (FixedLossScale(4), DynamicLossScale(4)):
        value = loss_scale()
        assert value.dtype == tf.float32 and value.shape == []
        assert float(value) == 4.0


def test_base_class_cannot_be_instantiated():
    with pytest.raises(TypeError):
        tf_lossscale.LossScale()


def test_subclass_missing_an_abstract_method_cannot_be_instantiated():
    class NoUpdate(tf_lossscale.LossScale):
        def __call__(self):
            return tf.constant(1.0)

        def get_config(self):
            return {}

    with pytest.raises(TypeError, match="update"):
        NoUpdate()


def test_dynamic_properties_and_config_are_the_constructor_arguments():
    loss_scale = DynamicLossScale(initial_loss_scale=16, increment_period=5,
                                  multiplier=4)
    assert (loss_scale.initial_loss_scale, loss_scale.increment_period,
            loss_scale.multiplier) == (16.0, 5, 4.0)
    assert [type(v) for v in loss_scale.get_config().values()] == [
        float, int, float]
    assert loss_scale.get_config() == {
        "initial_loss_scale": 16.0, "increment_period": 5, "multiplier": 4.0}


def test_dynamic_defaults_are_tensorflows():
    assert DynamicLossScale().get_config() == {
        "initial_loss_scale": 32768.0, "increment_period": 2000,
        "multiplier": 2.0}


def test_good_steps_is_read_only():
    loss_scale = DynamicLossScale()
    with pytest.raises(AttributeError):
        loss_scale.good_steps = 5
    assert loss_scale.good_steps.dtype == tf.int64


def test_fixed_config_holds_the_value_as_float():
    assert FixedLossScale(8).get_config() == {"loss_scale_value": 8.0}
    assert type(FixedLossScale(8).get_config()["loss_scale_value"]) is float


@pytest.mark.parametrize("loss_scale", [
    FixedLossScale(8), DynamicLossScale(4, 3, 1.5)], ids=["fixed", "dynamic"])
def test_from_config_round_trip(loss_scale):
    restored = type(loss_scale).from_config(loss_scale.get_config())
    assert type(restored) is type(loss_scale)
    assert restored.get_config() == loss_scale.get_config()
    assert float(restored()) == float(loss_scale())


@pytest.mark.parametrize("loss_scale", [
    FixedLossScale(8), DynamicLossScale(4, 3, 1.5)], ids=["fixed", "dynamic"])
def test_serialize_deserialize_round_trip(loss_scale):
    config = tf_lossscale.serialize(loss_scale)
    assert config == {"class_name": type(loss_scale).__name__,
                      "config": loss_scale.get_config()}
    restored = tf_lossscale.deserialize(config)
    assert type(restored) is type(loss_scale)
    assert restored.get_config() == loss_scale.get_config()


def test_fixed_repr():
    assert repr(FixedLossScale(8)) == "FixedLossScale(8.0)"


def test_dynamic_repr_shows_state_eagerly_and_config_in_graphs():
    loss_scale = DynamicLossScale(4, 3, 2)
    loss_scale.update([tf.constant([1.0])])
    assert repr(loss_scale) == (
        "DynamicLossScale(current_loss_scale=4.0, num_good_steps=1, "
        "initial_loss_scale=4.0, increment_period=3, multiplier=2.0)")
    with tf.compat.v1.Graph().as_default():
        assert repr(DynamicLossScale(4, 3, 2)) == (
            "DynamicLossScale(initial_loss_scale=4.0, increment_period=3, "
            "multiplier=2.0)")


def test_get_maps_each_accepted_identifier():
    dynamic = DynamicLossScale(4)
    assert tf_lossscale.get(None) is None
    assert tf_lossscale.get(dynamic) is dynamic
    assert repr(tf_lossscale.get(8)) == "FixedLossScale(8.0)"
    assert repr(tf_lossscale.get(np.float32(2.5))) == "FixedLossScale(2.5)"
    from_string = tf_lossscale.get("dynamic")
    assert type(from_string) is DynamicLossScale
    assert from_string.get_config() == DynamicLossScale().get_config()


@pytest.mark.parametrize("flags", [
    [True, True, True, False, True, False, False, True, True],
    [False, True, True, True, True],
])
def test_graph_update_op_is_a_tensor_with_tensorflows_values(flags):
    """`sess.run(update_op)` and `tf.identity(update_op)` give what TF's do."""
    def run(make):
        with tf.compat.v1.Graph().as_default(), \
                tf.compat.v1.Session() as sess:
            loss_scale = make()
            grads = tf.compat.v1.placeholder(tf.float32, [1])
            update_op, _ = loss_scale.update([grads])
            same = tf.identity(update_op)
            sess.run(tf.compat.v1.global_variables_initializer())
            out = []
            for flag in flags:
                out.append(bool(sess.run(same, {grads: _grads(flag)})))
                out.append(float(sess.run(loss_scale())))
            return out

    ours = run(lambda: DynamicLossScale(4.0, 2, 2.0))
    theirs = run(lambda: tf.compat.v1.mixed_precision.DynamicLossScale(
        4.0, 2, 2.0))
    assert ours == theirs
    assert True in ours[::2] and ours[1::2][-1] > 0


def test_eager_repr_is_tensorflows():
    ours, theirs = DynamicLossScale(4.0, 3), \
        tf.compat.v1.mixed_precision.DynamicLossScale(4.0, 3)
    for loss_scale in (ours, theirs):
        loss_scale.update([tf.constant([1.0])])
    assert repr(ours) == repr(theirs)
    assert repr(FixedLossScale(3)) == repr(
        tf.compat.v1.mixed_precision.FixedLossScale(3))


@pytest.mark.parametrize("cls", [
    DynamicLossScale, tf.compat.v1.mixed_precision.DynamicLossScale],
    ids=["ours", "tensorflow"])
def test_tensorflow_private_variable_names_read_and_assign(cls):
    # Legacy code reads `loss_scale._current_loss_scale` and
    # `_num_good_steps`, and TF's tests assign the first; both classes agree.
    tf.get_logger().setLevel("ERROR")
    loss_scale = cls(initial_loss_scale=4, increment_period=3)
    loss_scale._current_loss_scale.assign(2)
    assert float(loss_scale()) == 2.0
    loss_scale.update([tf.constant([1.0])])
    assert int(loss_scale._num_good_steps) == 1
    assert float(loss_scale._current_loss_scale) == 2.0
    loss_scale.update([tf.constant([NAN])])
    assert (int(loss_scale._num_good_steps),
            float(loss_scale._current_loss_scale)) == (0, 1.0)
