"""`tf_lossscale.experimental.LossScaleOptimizer`: seeds/001, docs/migrating.md."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_lossscale
from tf_lossscale import experimental
from tf_lossscale.keras_optimizer import KerasLossScaleOptimizer

# TensorFlow's own loss scales log a deprecation notice when created.
tf.get_logger().setLevel("ERROR")


def _without_names(config):
    """A config minus Keras' auto-numbered names (sgd, sgd_1, ...)."""
    if isinstance(config, dict):
        return {k: _without_names(v) for k, v in config.items()
                if k != "name"}
    return config


def _experimental(*args, **kwargs):
    with pytest.warns(DeprecationWarning):
        return experimental.LossScaleOptimizer(*args, **kwargs)


def _tf_dynamic(**kwargs):
    return tf.compat.v1.mixed_precision.DynamicLossScale(**kwargs)


# The three example pairs of seeds/001, with the seed's TF DynamicLossScale,
# and the same with this package's classes.
SEED_PAIRS = {
    "dynamic": ("dynamic", {}),
    "fixed_123": (123, {"dynamic": False, "initial_scale": 123}),
    "tf_dynamic_2048_500": (
        lambda: _tf_dynamic(initial_loss_scale=2048, increment_period=500),
        {"initial_scale": 2048, "dynamic_growth_steps": 500}),
    "ours_dynamic_2048_500": (
        lambda: tf_lossscale.DynamicLossScale(2048, 500),
        {"initial_scale": 2048, "dynamic_growth_steps": 500}),
    "ours_fixed_64": (
        lambda: tf_lossscale.FixedLossScale(64),
        {"dynamic": False, "initial_scale": 64}),
    "tf_fixed_64": (
        lambda: tf.compat.v1.mixed_precision.FixedLossScale(64),
        {"dynamic": False, "initial_scale": 64}),
    "float_fixed": (2.5, {"dynamic": False, "initial_scale": 2.5}),
}


@pytest.mark.parametrize("case", list(SEED_PAIRS))
def test_example_pair_gives_equal_configs(case):
    loss_scale, current_args = SEED_PAIRS[case]
    if callable(loss_scale):
        loss_scale = loss_scale()
    opt1 = _experimental(keras.optimizers.SGD(), loss_scale=loss_scale)
    opt2 = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(), **current_args)
    assert _without_names(opt1.get_config()) == _without_names(
        opt2.get_config())


def test_example_pair_with_names_gives_identical_configs():
    opt1 = _experimental(keras.optimizers.SGD(name="sgd"), loss_scale=123,
                         name="lso")
    opt2 = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(name="sgd"), dynamic=False, initial_scale=123,
        name="lso")
    assert opt1.get_config() == opt2.get_config()
    assert opt1.get_config()["initial_scale"] == 123.0


def test_isinstance_holds_in_one_direction_only():
    opt1 = _experimental(keras.optimizers.SGD(), loss_scale="dynamic")
    opt2 = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD())
    assert isinstance(opt1, tf_lossscale.LossScaleOptimizer)
    assert not isinstance(opt2, experimental.LossScaleOptimizer)
    assert issubclass(experimental.LossScaleOptimizer,
                      tf_lossscale.LossScaleOptimizer)
    assert not issubclass(tf_lossscale.LossScaleOptimizer,
                          experimental.LossScaleOptimizer)


def test_mixed_float16_compile_keeps_it_unwrapped():
    opt = _experimental(keras.optimizers.SGD(), loss_scale="dynamic")
    assert isinstance(opt, keras.mixed_precision.LossScaleOptimizer)
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(optimizer=opt, loss="mse")
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert model.optimizer is opt


@pytest.mark.parametrize("multiplier", [3.0, 1.5])
@pytest.mark.parametrize("owner", ["tf", "ours"])
def test_dynamic_loss_scale_with_multiplier_not_2_is_rejected(owner,
                                                              multiplier):
    if owner == "tf":
        loss_scale = _tf_dynamic(multiplier=multiplier)
    else:
        loss_scale = tf_lossscale.DynamicLossScale(multiplier=multiplier)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match=f"multiplier={multiplier}"):
            experimental.LossScaleOptimizer(keras.optimizers.SGD(),
                                            loss_scale)
    assert not [w for w in caught
                if issubclass(w.category, DeprecationWarning)]


@pytest.mark.parametrize("loss_scale", ["static", None, 0.5, -1, [2.0],
                                        True],
                         ids=repr)
def test_unconvertible_loss_scale_raises_value_error(loss_scale):
    with pytest.raises(ValueError, match="loss_scale") as e:
        experimental.LossScaleOptimizer(keras.optimizers.SGD(), loss_scale)
    assert repr(loss_scale) in str(e.value)


def test_non_optimizer_raises_type_error():
    with pytest.raises(TypeError, match="keras.optimizers.Optimizer"):
        experimental.LossScaleOptimizer("sgd", "dynamic")


def test_construction_warns_once_naming_the_replacement():
    inner = keras.optimizers.SGD()
    loss_scale = tf_lossscale.DynamicLossScale(2048, 500)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        experimental.LossScaleOptimizer(inner, loss_scale)
    deprecations = [w for w in caught
                    if issubclass(w.category, DeprecationWarning)]
    assert len(deprecations) == 1
    message = str(deprecations[0].message)
    assert ("tf_lossscale.LossScaleOptimizer(optimizer, initial_scale=2048.0, "
            "dynamic_growth_steps=500)") in message
    assert deprecations[0].filename == __file__


def test_it_trains_as_the_current_optimizer():
    var = keras.Variable([1.0, 2.0])
    opt = _experimental(keras.optimizers.SGD(1.0), loss_scale=_tf_dynamic(
        initial_loss_scale=4, increment_period=2))
    assert (opt.dynamic, opt.initial_scale, opt.dynamic_growth_steps) == (
        True, 4.0, 2)
    # Applied as given (unscaled), as TF 2.4's class applied them.
    opt.apply_gradients([(tf.constant([1.0, 2.0]), var)])
    np.testing.assert_array_equal(var, [0.0, 0.0])
    opt.apply_gradients([(tf.constant([np.nan, 8.0]), var)])
    np.testing.assert_array_equal(var, [0.0, 0.0])
    assert (float(opt.loss_scale), int(opt.iterations)) == (2.0, 2)


@pytest.mark.parametrize("loss_scale", ["dynamic", 16.0])
def test_deserializing_gives_the_current_class_as_tf_2_4_did(loss_scale):
    # TF 2.4 and tf_keras deserialize an experimental optimizer's config
    # ("LossScaleOptimizerV1") as the non-experimental class.
    opt = _experimental(keras.optimizers.SGD(), loss_scale)
    config = keras.optimizers.serialize(opt)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        restored = keras.optimizers.deserialize(config)
    assert type(restored) is KerasLossScaleOptimizer
    assert not isinstance(restored, tf_lossscale.experimental.LossScaleOptimizer)
    assert restored.get_config() == opt.get_config()


@pytest.mark.parametrize("owner", ["tf", "ours"])
def test_multiplier_error_has_tf_2_4_wording_and_what_is_accepted(owner):
    make = _tf_dynamic if owner == "tf" else tf_lossscale.DynamicLossScale
    loss_scale = make(initial_loss_scale=8, increment_period=3, multiplier=4)
    with pytest.raises(ValueError) as e:
        experimental.LossScaleOptimizer(keras.optimizers.SGD(), loss_scale)
    message = str(e.value)
    assert message.startswith(
        'When passing a DynamicLossScale to "loss_scale", '
        f"DynamicLossScale.multiplier must be 2. Got: {loss_scale!r}. ")
    assert "DynamicLossScale(" in message and "multiplier=4.0" in message
    assert message.endswith(
        "always multiplies by 2; a DynamicLossScale with multiplier=4.0 has "
        "no equivalent. Use multiplier=2.0 (the default).")


class _OtherLossScale(tf_lossscale.LossScale):
    """A loss scale of neither class the optimizer can express."""

    def __call__(self):
        return tf.constant(1.0)

    def update(self, grads):
        return None, True

    def get_config(self):
        return {}


def test_other_loss_scale_class_error_has_tf_2_4_wording():
    loss_scale = _OtherLossScale()
    with pytest.raises(TypeError) as e:
        experimental.LossScaleOptimizer(keras.optimizers.SGD(), loss_scale)
    message = str(e.value)
    assert message.startswith(
        "Passing a LossScale that is not a FixedLossScale or a "
        f"DynamicLossScale is no longer supported. Got: {loss_scale!r} of "
        "type _OtherLossScale")
    assert "'dynamic', a number, a FixedLossScale or a DynamicLossScale" in (
        message)


def test_get_gradients_unscales_what_it_differentiates_as_tf_2_3_did():
    """TF 2.1-2.3's `get_gradients(loss, params)` (OpenNMT-tf called it):
    symbolic, the loss scaled, the gradients unscaled; Keras 3 optimizers
    have none of their own, so `tf.gradients` differentiates."""
    opt = _experimental(keras.optimizers.SGD(1.0), loss_scale=1024)
    v = tf.Variable([1.0, 2.0])
    w = tf.Variable(3.0)
    unused = tf.Variable(1.0, name="unused")

    @tf.function
    def both():
        return opt.get_gradients(tf.reduce_sum(v * v) * w, [v, w])

    dv, dw = both()
    np.testing.assert_array_equal(dv, [6.0, 12.0])  # 2 v w
    assert float(dw) == 5.0  # sum(v * v)

    @tf.function
    def one_without_gradient():
        return opt.get_gradients(tf.reduce_sum(v), [v, unused])

    with pytest.raises(ValueError, match="'unused:0' has no gradient"):
        one_without_gradient()
    with pytest.raises(RuntimeError, match="GradientTape"):
        opt.get_gradients(tf.reduce_sum(v), [v])  # eagerly, as TF's
    assert float(opt.loss_scale) == 1024.0 and int(opt.iterations) == 0
