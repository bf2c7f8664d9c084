"""The defects the differential bad-input fuzz found (issue 22 item 5).

Each test runs the scenario on ours and on its original and failed before
its fix; the tf_keras ones are in `tf_keras_cases/
cases_differential_bad_input.py`.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.keras.mixed_precision import loss_scale as tf_keras_ls

import tf_lossscale

TF = tf.compat.v1.mixed_precision
V1 = tf.compat.v1
KERAS3 = keras.mixed_precision.LossScaleOptimizer


def _one_step(cls):
    variable = keras.Variable([1.0, 2.0])
    opt = cls(keras.optimizers.SGD(0.5))
    opt.apply([tf.constant([1.0, 1.0])], [variable])
    return opt


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float32,
                                   tf.float64])
def test_scale_loss_follows_keras3s_dtype_rule(dtype):
    loss = tf.constant(4.0, dtype)
    ours_unbuilt = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD()).scale_loss(loss)
    theirs_unbuilt = KERAS3(keras.optimizers.SGD()).scale_loss(loss)
    ours, theirs = (_one_step(c).scale_loss(loss) for c in (
        tf_lossscale.LossScaleOptimizer, KERAS3))
    assert ours.dtype == theirs.dtype
    assert ours_unbuilt.dtype == theirs_unbuilt.dtype == dtype
    assert float(ours) == float(theirs) == 131072.0 or dtype == tf.float64
    if dtype == tf.float16:
        # The case: float32 131072 after a step, not float16 inf.
        assert ours.dtype == tf.float32 and float(ours) == 131072.0
        assert np.isinf(float(ours_unbuilt)) and np.isinf(
            float(theirs_unbuilt))


def _state(opt, variables):
    return [v.numpy().copy() for v in variables] + [
        v.numpy().copy() for v in opt.variables]


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("row", [3, -1])
def test_a_step_that_raises_on_a_bad_sparse_row_changes_nothing(traced,
                                                                 row):
    for cls in (tf_lossscale.LossScaleOptimizer, KERAS3):
        dense = keras.Variable([1.0, 2.0])
        table = keras.Variable(np.ones((3, 2), np.float32))
        opt = cls(keras.optimizers.Adam(0.1))
        opt.apply_gradients([(tf.ones([2]), dense), (tf.ones([3, 2]), table)])
        before = _state(opt, [dense, table])
        grads = [tf.ones([2]), tf.IndexedSlices(
            tf.ones([1, 2]), tf.constant([row]), tf.constant([3, 2]))]

        def step():
            opt.apply_gradients(zip(grads, [dense, table]))  # noqa: B023
        with pytest.raises(tf.errors.InvalidArgumentError):
            tf.function(step)() if traced else step()
        after = _state(opt, [dense, table])
        assert all(np.array_equal(a, b) for a, b in zip(before, after)), (
            cls, before, after)


def test_a_good_sparse_row_still_applies():
    table = keras.Variable(np.ones((3, 2), np.float32))
    results = []
    for cls in (tf_lossscale.LossScaleOptimizer, KERAS3):
        variable = keras.Variable(table.numpy())
        opt = cls(keras.optimizers.SGD(0.5))
        grad = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([2]),
                                tf.constant([3, 2]))
        opt.apply([tf.IndexedSlices(grad.values * opt.scale_loss(1.0),
                                    grad.indices, grad.dense_shape)],
                  [variable])
        results.append(variable.numpy())
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[0], [[1, 1], [1, 1], [0.5, 0.5]])


SCALARS = {
    "tf_constant": lambda: tf.constant(1024.0),
    "tf_constant_int": lambda: tf.constant(1024),
    "np_0d": lambda: np.array(1024.0),
    "np_float32": lambda: np.float32(1024),
    "tf_variable": lambda: tf.Variable(1024.0),
}


@pytest.mark.parametrize("make", SCALARS.values(), ids=SCALARS.keys())
def test_scalar_tensors_and_arrays_are_numbers_as_in_the_originals(make):
    ours = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(),
                                           initial_scale=make(),
                                           dynamic_growth_steps=make())
    theirs = KERAS3(keras.optimizers.SGD(), initial_scale=make(),
                    dynamic_growth_steps=make())
    assert (ours.initial_scale, ours.dynamic_growth_steps) == (1024.0, 1024)
    assert float(ours.scale_loss(1.0)) == float(theirs.scale_loss(1.0))
    for cls in (tf_lossscale.DynamicLossScale, TF.DynamicLossScale):
        loss_scale = cls(initial_loss_scale=make(), multiplier=make())
        assert float(loss_scale()) == 1024.0
        assert float(loss_scale.get_config()["multiplier"]) == 1024.0


def test_serialize_none_and_tensorflows_own_loss_scales():
    assert tf_lossscale.serialize(None) is tf_keras_ls.serialize(None) is None
    for theirs in (TF.FixedLossScale(3), TF.DynamicLossScale(3.0, 5, 4.0)):
        assert tf_lossscale.serialize(theirs) == tf_keras_ls.serialize(theirs)
        assert tf_lossscale.get(theirs) is theirs is tf_keras_ls.get(theirs)


def test_deserialize_takes_what_tf24s_policy_passes():
    """TF 2.4's experimental Policy calls get(dict) and deserialize(config,
    custom_objects=...); Keras 3 configs carry `module`/`registered_name`."""
    plain = {"class_name": "DynamicLossScale",
             "config": {"initial_loss_scale": 8.0, "increment_period": 3,
                        "multiplier": 2.0}}
    keras3_style = {"module": "tf_lossscale", **plain,
                    "registered_name": None}
    for config in (plain, keras3_style):
        for ours, theirs in (
                (tf_lossscale.deserialize(config, custom_objects={}),
                 tf_keras_ls.deserialize(config, custom_objects={})),
                (tf_lossscale.deserialize(config, custom_objects=None),
                 tf_keras_ls.deserialize(config, custom_objects=None)),
                (tf_lossscale.get(config), tf_keras_ls.get(config))):
            assert type(ours) is tf_lossscale.DynamicLossScale
            assert ours.get_config() == theirs.get_config()
    custom = {"class_name": "Mine", "config": {"loss_scale_value": 2}}
    assert tf_lossscale.deserialize(
        custom, custom_objects={"Mine": tf_lossscale.FixedLossScale}
    ).get_config() == tf_keras_ls.deserialize(
        custom, custom_objects={"Mine": TF.FixedLossScale}).get_config()
    assert tf_lossscale.deserialize(None) is tf_keras_ls.deserialize(None)
    assert tf_lossscale.deserialize("DynamicLossScale").get_config() == (
        tf_keras_ls.deserialize("DynamicLossScale").get_config())
    bad = {"class_name": "FixedLossScale", "config": {"x": 1}}
    for deserialize in (tf_lossscale.deserialize, tf_keras_ls.deserialize):
        with pytest.raises(TypeError):
            deserialize(bad)


def test_a_wrong_shaped_gradient_raises_the_originals_type():
    variable = tf.Variable([1.0, 2.0])
    errors = []
    for cls in (tf_lossscale.MixedPrecisionLossScaleOptimizer,
                TF.MixedPrecisionLossScaleOptimizer):
        opt = cls(V1.train.GradientDescentOptimizer(0.5), 8.0)
        with pytest.raises(tf.errors.InvalidArgumentError) as info:
            opt.apply_gradients([(tf.ones([3]), variable)])
        errors.append(info.value)
    ours = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD())
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        ours.apply_gradients([(tf.ones([3]), keras.Variable([1.0, 2.0]))])
    assert isinstance(info.value, ValueError)  # Ours: both.
    assert "shape (3,)" in str(info.value)


def test_a_loss_function_returning_none_raises_attribute_error():
    variable = tf.Variable([1.0])
    for cls in (tf_lossscale.MixedPrecisionLossScaleOptimizer,
                TF.MixedPrecisionLossScaleOptimizer):
        opt = cls(V1.train.GradientDescentOptimizer(0.5), 8.0)
        with pytest.raises(AttributeError):
            opt.minimize(lambda: None, var_list=[variable])
    ours = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD())
    with pytest.raises(AttributeError, match="loss is None"):
        ours.minimize(lambda: None, [keras.Variable([1.0])])


def test_eager_minimize_with_a_tensor_in_var_list_raises_value_error():
    ours = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD())
    tensor = tf.constant([1.0])
    with pytest.raises(ValueError, match="Only variables") as info:
        ours.minimize(lambda: tf.reduce_sum(tensor), [tensor])
    assert isinstance(info.value, NotImplementedError)  # As tf_keras.
    before = ours.iterations.numpy()
    assert before == 0 and not ours.built


def test_apply_gradients_returns_the_step_counter():
    """Deliberate: Keras 3 returns its wrapper's own iteration variable,
    which never advances; ours returns `iterations`, which does."""
    variable = keras.Variable([1.0, 2.0])
    ours = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD())
    theirs = KERAS3(keras.optimizers.SGD())
    for _ in range(2):
        returned_ours = ours.apply_gradients([(tf.ones([2]), variable)])
        returned_theirs = theirs.apply_gradients([(tf.ones([2]), variable)])
    assert int(returned_ours.numpy()) == int(ours.iterations.numpy()) == 2
    assert int(returned_theirs.numpy()) == 0
    assert int(theirs.iterations.numpy()) == 2


@pytest.mark.parametrize("fixed", [True, False], ids=["fixed", "dynamic"])
def test_v1_optimizer_trains_reference_variables_in_a_tf2_process(fixed):
    def run(cls, grad):
        with tf.Graph().as_default():
            variable = V1.Variable([1.0, 2.0], use_resource=False)
            opt = cls(V1.train.GradientDescentOptimizer(0.5),
                      8.0 if fixed else "dynamic")
            train = opt.apply_gradients([(tf.constant(grad), variable)])
            with V1.Session() as session:
                session.run(V1.global_variables_initializer())
                session.run(train)
                return session.run(variable).tolist()

    ours = run(tf_lossscale.MixedPrecisionLossScaleOptimizer, [1.0, 2.0])
    assert ours == [0.5, 1.0]
    if fixed:  # TensorFlow's fails to build with a dynamic scale here.
        assert run(TF.MixedPrecisionLossScaleOptimizer, [1.0, 2.0]) == ours
    # A NaN step is skipped on reference variables too.
    assert run(tf_lossscale.MixedPrecisionLossScaleOptimizer,
               [float("nan"), 2.0]) == [1.0, 2.0]
