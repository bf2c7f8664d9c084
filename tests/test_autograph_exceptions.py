"""Every exception type of ours keeps its type inside `tf.function` (item 4).

AutoGraph re-raises an exception from converted code with its own type only
if it can rebuild it from a message: the type is one of a few builtins, or
its `__init__` is `Exception.__init__`. Our exception types have two bases
(so that code written against either original catches them) and would
otherwise reach a `tf.function` caller as AutoGraph's `StagingError`.

Each case raises one of our types, eagerly and inside a `tf.function`, and
checks the exact type both times; where an original raises in the same
place, its type is checked too (ours is a subclass of it, or the listed
reason says why not).
"""

from __future__ import annotations

import keras
import pytest
import tensorflow as tf
from tensorflow.python.keras.mixed_precision import loss_scale as tf_keras_ls

import tf_lossscale
from tf_lossscale import _checks, distribute, gradient_check, loss_scale
from tf_lossscale.keras_optimizer import UnbuiltApplyError
from tf_lossscale.v1_optimizer import NotAV1OptimizerError

TF = tf.compat.v1.mixed_precision


def _raise_in(mode, call):
    """Runs `call` eagerly or inside a tf.function; returns what it raised."""
    run = call if mode == "eager" else tf.function(call)
    with pytest.raises(Exception) as info:
        run()
    return info.value


def _keras3_two_variables():
    variables = [keras.Variable([1.0, 2.0]), keras.Variable([3.0])]
    opt = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(0.5))
    opt.build(variables)
    return opt, variables


def _keras3_apply_wrong_shape():
    opt, variables = _keras3_two_variables()
    return lambda: opt.apply([tf.ones([3]), tf.ones([1])], variables)


def _keras3_original_apply_wrong_shape():
    variables = [keras.Variable([1.0, 2.0]), keras.Variable([3.0])]
    opt = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.5))
    opt.build(variables)
    return lambda: opt.apply([tf.ones([3]), tf.ones([1])], variables)


def _keras3_unbuilt_apply():
    opt = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(0.5))
    return lambda: opt.apply([tf.ones([2])])


def _keras3_original_unbuilt_apply():
    opt = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.5))
    return lambda: opt.apply([tf.ones([2])])


def _keras3_scaled_none():
    opt = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(0.5))
    return lambda: opt.get_scaled_loss(None)


def _keras3_minimize_tensor():
    opt = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(0.5))
    tensor = tf.constant([1.0, 2.0])
    return lambda: opt.minimize(lambda: tf.reduce_sum(tensor), [tensor])


def _v1_minimize_none_loss(cls):
    def make():
        variable = tf.Variable([1.0])
        opt = cls(tf.compat.v1.train.GradientDescentOptimizer(0.5), 8.0)
        return lambda: opt.compute_gradients(lambda: None, [variable])
    return make


def _const(call):
    return lambda: call


# (id, our type, makes our call, makes the original's call or None, the
# original's type or why there is none).
CASES = [
    ("not_a_number", _checks.NotANumberError,
     _const(lambda: tf_lossscale.DynamicLossScale(None)),
     _const(lambda: TF.DynamicLossScale(None)), TypeError),
    ("loss_scale_config", loss_scale.LossScaleConfigError,
     _const(lambda: tf_lossscale.deserialize(
         {"class_name": "FixedLossScale", "config": {"x": 1}})),
     _const(lambda: tf_keras_ls.deserialize(
         {"class_name": "FixedLossScale", "config": {"x": 1}})), TypeError),
    ("gradient_shape", gradient_check.GradientShapeError,
     _keras3_apply_wrong_shape, _keras3_original_apply_wrong_shape,
     # Keras 3 raises from inside: InvalidArgumentError eagerly, ValueError
     # when traced; ours is both.
     (tf.errors.InvalidArgumentError, ValueError)),
    ("unbuilt_apply", UnbuiltApplyError, _keras3_unbuilt_apply,
     _keras3_original_unbuilt_apply, (TypeError, ValueError)),
    ("loss_is_none", gradient_check.LossIsNoneError, _keras3_scaled_none,
     None, "Keras 3 has no get_scaled_loss"),
    ("loss_is_none_v1", gradient_check.LossIsNoneError,
     _v1_minimize_none_loss(tf_lossscale.MixedPrecisionLossScaleOptimizer),
     _v1_minimize_none_loss(TF.MixedPrecisionLossScaleOptimizer),
     AttributeError),
    ("not_a_variable", gradient_check.NotAVariableError,
     _keras3_minimize_tensor, None, "Keras 3 has no minimize"),
    ("not_a_v1_optimizer", NotAV1OptimizerError,
     _const(lambda: tf_lossscale.MixedPrecisionLossScaleOptimizer(
         "sgd", 8.0)),
     _const(lambda: TF.MixedPrecisionLossScaleOptimizer("sgd", 8.0)),
     ValueError),
    ("keras3_positional_neither", _checks.NotANumberError,
     _const(lambda: tf_lossscale.LossScaleOptimizer(
         keras.optimizers.SGD(), "x")),
     None, "Keras 3 stores the string and fails on first use"),
]


@pytest.mark.parametrize("mode", ["eager", "tf_function"])
@pytest.mark.parametrize("ours_type, make_ours, make_theirs, theirs_type",
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_our_exception_keeps_its_type(mode, ours_type, make_ours,
                                      make_theirs, theirs_type):
    raised = _raise_in(mode, make_ours())
    assert type(raised) is ours_type, (type(raised), raised)
    if make_theirs is None:
        return
    original = _raise_in(mode, make_theirs())
    assert isinstance(original, theirs_type), (type(original), original)
    # Code that catches what the original raised catches ours too.
    caught = theirs_type if isinstance(theirs_type, tuple) else (theirs_type,)
    assert any(isinstance(raised, t) and isinstance(original, t)
               for t in caught), (type(raised), type(original))


@pytest.mark.parametrize("mode", ["eager", "tf_function"])
def test_update_in_a_replica_context_raises_replica_context_error(
        mode, mirrored_strategy):
    """The issue's case: `except RuntimeError` catches it inside tf.function.

    TensorFlow 2.21's own class fails here with an AttributeError from
    inside (it reads a strategy attribute that is gone), so there is no
    type to compare with: ours raises the RuntimeError TensorFlow documents.
    """
    with mirrored_strategy.scope():
        ls = tf_lossscale.DynamicLossScale()

    def call():
        return mirrored_strategy.run(
            lambda: ls.update([tf.constant(1.0)])[1])

    raised = _raise_in(mode, call)
    assert type(raised) is distribute.ReplicaContextError
    assert isinstance(raised, RuntimeError) and "cross-replica" in str(raised)


@pytest.mark.parametrize("mode", ["eager", "tf_function"])
def test_keras3_apply_in_cross_replica_context_raises_replica_context_error(
        mode, mirrored_strategy):
    with mirrored_strategy.scope():
        variable = keras.Variable([1.0, 2.0])
        opt = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(0.5))
        opt.build([variable])

    def call():
        with mirrored_strategy.scope():  # The cross-replica context.
            return opt.apply([tf.ones([2])], [variable])

    raised = _raise_in(mode, call)
    assert type(raised) is distribute.ReplicaContextError
    assert isinstance(raised, ValueError) and isinstance(raised, RuntimeError)


@pytest.mark.parametrize("mode", ["eager", "tf_function"])
@pytest.mark.parametrize("call, expected", [
    (lambda: tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(),
                                             initial_scale=-1.0), ValueError),
    (lambda: tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(), True,
                                             1.0, 5, 7, 8), TypeError),
    (lambda: tf_lossscale.get("dynamik"), ValueError),
], ids=["value_error", "type_error", "get_value_error"])
def test_builtin_types_keep_their_type(mode, call, expected):
    raised = _raise_in(mode, call)
    assert type(raised) is expected, (type(raised), raised)
