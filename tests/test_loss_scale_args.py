"""Bad arguments: a `ValueError` naming the argument, echoing the value and
saying what is accepted, raised before any variable exists."""

import re

import numpy as np
import pytest
import tensorflow as tf

import tf_lossscale
from tf_lossscale import DynamicLossScale, FixedLossScale

NAN, INF = float("nan"), float("inf")

# (id, call, argument name, value echoed, phrase naming what is accepted)
BAD_CONSTRUCTIONS = [
    ("fixed_half", lambda: FixedLossScale(0.5), "loss_scale_value", "0.5",
     ">= 1"),
    ("fixed_zero", lambda: FixedLossScale(0), "loss_scale_value", "0", ">= 1"),
    ("fixed_string", lambda: FixedLossScale("8"), "loss_scale_value", "'8'",
     "int or float"),
    ("fixed_bool", lambda: FixedLossScale(True), "loss_scale_value", "True",
     "int or float"),
    ("fixed_nan", lambda: FixedLossScale(NAN), "loss_scale_value", "nan",
     "finite"),
    ("fixed_inf", lambda: FixedLossScale(INF), "loss_scale_value", "inf",
     "finite"),
    ("fixed_above_float32", lambda: FixedLossScale(1e39), "loss_scale_value",
     "1e+39", "float32"),
    ("fixed_tensor", lambda: FixedLossScale(tf.constant(8.0)),
     "loss_scale_value", "<tf.Tensor", "int or float"),
    ("initial_nan", lambda: DynamicLossScale(NAN), "initial_loss_scale", "nan",
     "finite"),
    ("initial_inf", lambda: DynamicLossScale(INF), "initial_loss_scale", "inf",
     "finite"),
    ("initial_zero", lambda: DynamicLossScale(0), "initial_loss_scale", "0",
     "> 0"),
    ("initial_negative", lambda: DynamicLossScale(-4.0), "initial_loss_scale",
     "-4.0", "> 0"),
    ("initial_zero_in_float32", lambda: DynamicLossScale(1e-50),
     "initial_loss_scale", "1e-50", "float32"),
    ("initial_bool", lambda: DynamicLossScale(True), "initial_loss_scale",
     "True", "int or float"),
    ("initial_string", lambda: DynamicLossScale("dynamic"),
     "initial_loss_scale", "'dynamic'", "int or float"),
    ("period_zero", lambda: DynamicLossScale(increment_period=0),
     "increment_period", "0", "int >= 1"),
    ("period_negative", lambda: DynamicLossScale(increment_period=-3),
     "increment_period", "-3", "int >= 1"),
    ("period_float", lambda: DynamicLossScale(increment_period=1.5),
     "increment_period", "1.5", "int >= 1"),
    ("period_bool", lambda: DynamicLossScale(increment_period=True),
     "increment_period", "True", "int >= 1"),
    ("period_beyond_int64", lambda: DynamicLossScale(increment_period=2**63),
     "increment_period", str(2**63), "2**63"),
    ("multiplier_one", lambda: DynamicLossScale(multiplier=1), "multiplier",
     "1", "> 1"),
    ("multiplier_half", lambda: DynamicLossScale(multiplier=0.5), "multiplier",
     "0.5", "> 1"),
    ("multiplier_inf", lambda: DynamicLossScale(multiplier=INF), "multiplier",
     "inf", "finite"),
    ("multiplier_nan", lambda: DynamicLossScale(multiplier=NAN), "multiplier",
     "nan", "finite"),
    ("multiplier_one_in_float32", lambda: DynamicLossScale(
        multiplier=1 + 1e-9), "multiplier", "1.000000001", "float32"),
    ("multiplier_bool", lambda: DynamicLossScale(multiplier=True),
     "multiplier", "True", "int or float"),
]


@pytest.mark.parametrize(
    "make, name, echoed, accepted",
    [case[1:] for case in BAD_CONSTRUCTIONS],
    ids=[case[0] for case in BAD_CONSTRUCTIONS])
def test_bad_constructor_argument_is_named_echoed_and_explained(
        make, name, echoed, accepted):
    with pytest.raises(ValueError) as info:
        make()
    message = str(info.value)
    assert message.startswith(name + " must be"), message
    assert "got " + echoed in message, message
    assert accepted in message, message


class _VariableCounter:
    """Records the name of every variable created in its scope."""

    def __init__(self):
        self.names = []

    def __call__(self, next_creator, **kwargs):
        self.names.append(kwargs.get("name"))
        return next_creator(**kwargs)


def test_variable_counter_sees_a_valid_constructor():
    counter = _VariableCounter()
    with tf.variable_creator_scope(counter):
        DynamicLossScale(8)
    assert counter.names == ["current_loss_scale", "good_steps"]


@pytest.mark.parametrize(
    "make", [case[1] for case in BAD_CONSTRUCTIONS],
    ids=[case[0] for case in BAD_CONSTRUCTIONS])
def test_constructor_that_raises_creates_no_variable(make):
    counter = _VariableCounter()
    with tf.variable_creator_scope(counter), pytest.raises(ValueError):
        make()
    assert counter.names == []


def test_constructor_that_raises_in_a_graph_leaves_it_without_variables():
    with tf.compat.v1.Graph().as_default():
        with pytest.raises(ValueError):
            DynamicLossScale(8, increment_period=0)
        assert tf.compat.v1.global_variables() == []


@pytest.mark.parametrize("identifier, echoed", [
    ("static", "'static'"),
    ("Dynamic", "'Dynamic'"),
    (True, "True"),
    ([1], "[1]"),
    ({"class_name": "DynamicLossScale"}, "{'class_name'"),
    (tf.constant(8.0), "<tf.Tensor"),
    (np.array([1.0, 2.0]), "array"),
])
def test_get_rejects_anything_else(identifier, echoed):
    with pytest.raises(ValueError) as info:
        tf_lossscale.get(identifier)
    message = str(info.value)
    assert "got " + echoed in message, message
    assert "'dynamic'" in message and "LossScale" in message, message


def test_get_of_a_number_below_one_names_the_fixed_argument():
    with pytest.raises(ValueError, match=r"loss_scale_value .* got 0\.5"):
        tf_lossscale.get(0.5)


BAD_CONFIGS = [
    ("unknown_class", {"class_name": "StaticLossScale",
                       "config": {"loss_scale_value": 2.0}}),
    ("base_class", {"class_name": "LossScale", "config": {}}),
    ("missing_config", {"class_name": "DynamicLossScale"}),
    ("missing_class", {"config": {"loss_scale_value": 2.0}}),
    ("fixed_missing_value", {"class_name": "FixedLossScale", "config": {}}),
    ("unknown_key", {"class_name": "DynamicLossScale",
                     "config": {"initial_scale": 2.0}}),
    ("config_not_a_dict", {"class_name": "FixedLossScale", "config": 2.0}),
    ("not_a_dict", "dynamic"),
]


@pytest.mark.parametrize("config", [c[1] for c in BAD_CONFIGS],
                         ids=[c[0] for c in BAD_CONFIGS])
def test_deserialize_rejects_a_bad_config_saying_what_it_takes(config):
    with pytest.raises(ValueError) as info:
        tf_lossscale.deserialize(config)
    message = str(info.value)
    assert repr(config) in message or repr(config.get("config")) in message
    assert "FixedLossScale" in message or "DynamicLossScale" in message


def test_deserialize_of_bad_values_names_the_argument():
    config = {"class_name": "DynamicLossScale",
              "config": {"initial_loss_scale": 8.0, "increment_period": 0,
                         "multiplier": 2.0}}
    with pytest.raises(ValueError, match=r"^increment_period must be .*got 0"):
        tf_lossscale.deserialize(config)


def test_serialize_rejects_anything_but_the_two_classes():
    with pytest.raises(ValueError, match=r"FixedLossScale or DynamicLossScale"
                       r".*got 'dynamic'"):
        tf_lossscale.serialize("dynamic")


def test_accepted_numbers_include_numpy_scalars():
    assert DynamicLossScale(np.float32(4), np.int64(3),
                            np.float64(2)).get_config() == {
        "initial_loss_scale": 4.0, "increment_period": 3, "multiplier": 2.0}
    assert re.fullmatch(r"FixedLossScale\(4\.0\)",
                        repr(FixedLossScale(np.int32(4))))


def test_integral_floats_are_accepted_as_the_originals_accept_them():
    ours = DynamicLossScale(increment_period=2000.0)
    theirs = tf.compat.v1.mixed_precision.DynamicLossScale(
        increment_period=2000.0)
    assert ours.increment_period == 2000
    assert isinstance(ours.increment_period, int)
    assert ours.get_config()["increment_period"] == theirs.get_config()[
        "increment_period"]


# TensorFlow's own `get` is not exported; its module is, on every supported TF.
_tf_loss_scale = pytest.importorskip(
    "tensorflow.python.training.experimental.loss_scale")


@pytest.mark.parametrize("call", [
    lambda lib: lib.FixedLossScale(0.5),
    lambda lib: lib.FixedLossScale(0),
    lambda lib: lib.FixedLossScale("8"),
    lambda lib: lib.FixedLossScale([2.0]),
    lambda lib: lib.get("static"),
    lambda lib: lib.get("Dynamic"),
    lambda lib: lib.get([1]),
], ids=["fixed_half", "fixed_zero", "fixed_string", "fixed_list",
        "get_static", "get_capitalized", "get_list"])
def test_message_contains_tensorflows_message(call):
    """Code matching TensorFlow's message (as its own tests do) still does."""
    with pytest.raises(ValueError) as theirs:
        call(_tf_loss_scale)
    with pytest.raises(ValueError) as ours:
        call(tf_lossscale)
    phrase = str(theirs.value).rstrip(".")
    assert phrase in str(ours.value), (phrase, str(ours.value))
