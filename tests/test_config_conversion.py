"""Config conversion: configs of TF <= 2.3, Keras 3 and ours load as ours.

`LossScaleOptimizer.from_config` reads every vintage through
`config_conversion.upgrade_optimizer_config`; these tests feed it configs
spelled as each of them wrote them.
"""

import keras
import pytest
import tensorflow as tf

import tf_lossscale
from tf_lossscale import config_conversion, experimental
from tf_lossscale.keras_optimizer import KerasLossScaleOptimizer

# An SGD as TF 2.3's `tf.keras.optimizers.serialize` wrote it.
TF23_SGD = {"class_name": "SGD",
            "config": {"name": "SGD", "learning_rate": 0.25, "decay": 0.0,
                       "momentum": 0.5, "nesterov": False}}


def _tf23_config(loss_scale):
    """A TF <= 2.3 experimental LossScaleOptimizer config."""
    return {"optimizer": TF23_SGD, "loss_scale": loss_scale}


def _attributes(opt):
    return opt.dynamic, opt.initial_scale, opt.dynamic_growth_steps


@pytest.mark.parametrize("loss_scale, expected", [
    ({"class_name": "DynamicLossScale",
      "config": {"initial_loss_scale": 2048.0, "increment_period": 500,
                 "multiplier": 2.0}}, (True, 2048.0, 500)),
    ({"class_name": "FixedLossScale", "config": {"loss_scale_value": 64.0}},
     (False, 64.0, None)),
    ("dynamic", (True, 32768.0, 2000)),
    (128, (False, 128.0, None)),
], ids=["serialized_dynamic", "serialized_fixed", "dynamic", "number"])
@pytest.mark.filterwarnings("ignore:Argument `decay`:UserWarning")
def test_tf23_config_loads_converted(loss_scale, expected):
    opt = tf_lossscale.LossScaleOptimizer.from_config(
        _tf23_config(loss_scale))
    assert type(opt) is KerasLossScaleOptimizer
    assert _attributes(opt) == expected
    assert isinstance(opt.inner_optimizer, keras.optimizers.SGD)
    assert float(opt.inner_optimizer.learning_rate) == 0.25
    assert opt.inner_optimizer.momentum == 0.5


def test_keras3_own_config_loads_as_ours():
    theirs = keras.mixed_precision.LossScaleOptimizer(
        keras.optimizers.Adam(0.5), initial_scale=256.0,
        dynamic_growth_steps=30, name="their_lso")
    opt = KerasLossScaleOptimizer.from_config(theirs.get_config())
    assert _attributes(opt) == (True, 256.0, 30)
    assert opt.name == "their_lso"
    assert isinstance(opt.inner_optimizer, keras.optimizers.Adam)
    assert float(opt.inner_optimizer.learning_rate) == 0.5


def test_older_keras3_config_with_base_defaults_loads():
    config = keras.mixed_precision.LossScaleOptimizer(
        keras.optimizers.SGD()).get_config()
    config.update(config_conversion.KERAS_BASE_OPTIMIZER_DEFAULTS)
    opt = tf_lossscale.LossScaleOptimizer.from_config(config)
    assert _attributes(opt) == (True, 32768.0, 2000)


def test_older_keras3_config_with_a_set_base_option_is_rejected():
    config = keras.mixed_precision.LossScaleOptimizer(
        keras.optimizers.SGD()).get_config()
    config["clipnorm"] = 1.0
    with pytest.raises(ValueError, match="clipnorm=1.0.*inner optimizer"):
        tf_lossscale.LossScaleOptimizer.from_config(config)


@pytest.mark.parametrize("kwargs", [
    {}, {"dynamic": False, "initial_scale": 8},
    {"initial_scale": 4, "dynamic_growth_steps": 9},
], ids=["defaults", "fixed", "dynamic"])
def test_our_config_round_trips(kwargs):
    opt = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(), **kwargs)
    restored = tf_lossscale.LossScaleOptimizer.from_config(opt.get_config())
    assert type(restored) is KerasLossScaleOptimizer
    assert restored.get_config() == opt.get_config()


def test_from_config_leaves_its_argument_unchanged():
    config = _tf23_config("dynamic")
    copy = {"optimizer": dict(TF23_SGD), "loss_scale": "dynamic"}
    with pytest.warns(UserWarning, match="decay"):
        tf_lossscale.LossScaleOptimizer.from_config(config)
    assert config == copy


def test_experimental_from_config_gives_the_experimental_class():
    with pytest.warns(DeprecationWarning):
        opt = experimental.LossScaleOptimizer.from_config(
            {"inner_optimizer": keras.optimizers.serialize(
                keras.optimizers.SGD()),
             "dynamic": True, "initial_scale": 16.0,
             "dynamic_growth_steps": 7})
    assert isinstance(opt, experimental.LossScaleOptimizer)
    assert _attributes(opt) == (True, 16.0, 7)


@pytest.mark.parametrize("config, match", [
    ({"inner_optimizer": TF23_SGD, "loss_scale": "dynamic",
      "dynamic": True}, "one spelling"),
    ({"optimizer": TF23_SGD, "inner_optimizer": TF23_SGD,
      "loss_scale": "dynamic"}, "one spelling"),
    (_tf23_config({"class_name": "DynamicLossScale",
                   "config": {"multiplier": 3.0}}), "multiplier=3.0"),
    (_tf23_config("static"), "'static'"),
    (_tf23_config({"class_name": "OtherLossScale", "config": {}}),
     "OtherLossScale"),
], ids=["loss_scale_and_dynamic", "optimizer_and_inner", "multiplier_3",
        "unknown_string", "unknown_class"])
def test_inconvertible_config_raises_value_error(config, match):
    with pytest.raises(ValueError, match=match):
        tf_lossscale.LossScaleOptimizer.from_config(config)


@pytest.mark.parametrize("config, error, match", [
    ("not a config", ValueError, "takes a dict.*'not a config'"),
    ({"dynamic": True}, ValueError, "needs an 'inner_optimizer' entry"),
    ({"inner_optimizer": TF23_SGD, "bogus": 1}, ValueError, "`bogus`"),
    ({"inner_optimizer": {"class_name": "NoSuchOptimizer", "config": {}}},
     TypeError, "inner_optimizer must be .*'NoSuchOptimizer'"),
], ids=["not_a_dict", "no_inner", "unknown_key", "unknown_inner"])
@pytest.mark.filterwarnings("ignore:Argument `decay`:UserWarning")
def test_malformed_config_raises_naming_what_is_wrong(config, error, match):
    with pytest.raises(error, match=match):
        tf_lossscale.LossScaleOptimizer.from_config(config)


def test_keras_deserialize_of_a_truncated_config_names_the_missing_entry():
    with pytest.raises(ValueError, match="'inner_optimizer'"):
        keras.optimizers.deserialize(
            {"class_name": "tf_lossscale>LossScaleOptimizer", "config": {}})


@pytest.mark.parametrize("args", [
    {"dynamic": True, "initial_scale": 2048.0, "dynamic_growth_steps": 500},
    {"dynamic": False, "initial_scale": 3.0, "dynamic_growth_steps": None},
])
def test_to_legacy_loss_scale_converts_back_to_the_same_arguments(args):
    legacy = config_conversion.to_legacy_loss_scale(**args)
    assert config_conversion.from_legacy_loss_scale(legacy) == args


def test_tensorflow_own_loss_scales_convert():
    tf.get_logger().setLevel("ERROR")  # TF logs a deprecation notice.
    dynamic = tf.compat.v1.mixed_precision.DynamicLossScale(
        initial_loss_scale=16, increment_period=3)
    fixed = tf.compat.v1.mixed_precision.FixedLossScale(5)
    assert config_conversion.from_legacy_loss_scale(dynamic) == {
        "dynamic": True, "initial_scale": 16.0, "dynamic_growth_steps": 3}
    assert config_conversion.from_legacy_loss_scale(fixed) == {
        "dynamic": False, "initial_scale": 5.0, "dynamic_growth_steps": None}


@pytest.mark.parametrize("cls", [tf_lossscale.LossScaleOptimizer,
                                 experimental.LossScaleOptimizer],
                         ids=["current", "experimental"])
def test_multiplier_error_from_a_config_has_tf_2_4_wording(cls):
    config = _tf23_config({"class_name": "DynamicLossScale",
                           "config": {"initial_loss_scale": 2.0,
                                      "increment_period": 3,
                                      "multiplier": 4.0}})
    with pytest.raises(ValueError) as e:
        cls.from_config(config)
    assert str(e.value) == (
        "Cannot deserialize LossScaleOptimizer with a DynamicLossScale whose "
        "multiplier is not 2. Got DynamicLossScale: DynamicLossScale("
        "initial_loss_scale=2.0, increment_period=3, multiplier=4.0). The "
        "optimizer's dynamic loss scaling always multiplies by 2; a "
        "DynamicLossScale with multiplier=4.0 has no equivalent. Use "
        "multiplier=2.0 (the default).")
