"""The Keras 3 `tf_lossscale.LossScaleOptimizer`: arguments, attributes, steps.

The tests that hold on both Kerases are written once, in _both_optimizer.py,
and run here on Keras 3 (imported below; the `flavour` fixture is Keras 3's
in this process) and in tf_keras_cases/cases_optimizer.py on tf_keras.
Distribution is in test_keras_optimizer_distributed.py, saving in
test_keras_optimizer_saving.py.
"""

import os
import subprocess
import sys
import warnings

import _model
import keras
import numpy as np
import pytest
import tensorflow as tf
from _both_optimizer import *  # noqa: F403 (the tests on both Kerases)

# "xla" in WITH_XLA: the step compiled whole (`jit_compile=True`, `fit`'s
# default on a GPU); the exactness tests run there too.
from _both_optimizer import MODES, WITH_XLA
from _both_optimizer import runner as _runner
from _both_optimizer import snapshot as _snapshot

import tf_lossscale
import tf_lossscale.compat
from tf_lossscale.keras_optimizer import KerasLossScaleOptimizer


def _slots(opt):
    """The inner optimizer's variables except its step counter."""
    return [v for v in opt.inner_optimizer.variables
            if not v.path.endswith("/iteration")]


# Construction, defaults, attributes.


def test_keras_inner_gives_the_keras_flavour_of_both_classes():
    opt = tf_lossscale.LossScaleOptimizer(keras.optimizers.Adam())
    assert type(opt) is KerasLossScaleOptimizer
    assert isinstance(opt, tf_lossscale.LossScaleOptimizer)
    assert isinstance(opt, keras.mixed_precision.LossScaleOptimizer)


def test_mixed_float16_compile_keeps_it_unwrapped():
    opt = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD())
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(optimizer=opt, loss="mse")
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert model.optimizer is opt


def test_dynamic_arguments_are_kept():
    opt = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(), initial_scale=0.5, dynamic_growth_steps=7)
    assert (opt.initial_scale, opt.dynamic_growth_steps) == (0.5, 7)
    assert float(opt.loss_scale) == 0.5


# Errors.


def test_wrapping_an_experimental_loss_scale_optimizer_raises_type_error():
    with pytest.warns(DeprecationWarning):
        inner = tf_lossscale.experimental.LossScaleOptimizer(
            keras.optimizers.SGD(), "dynamic")
    with pytest.raises(TypeError, match="cannot wrap another"):
        tf_lossscale.LossScaleOptimizer(inner)
    with pytest.raises(TypeError, match="cannot wrap another"):
        KerasLossScaleOptimizer(inner)


def test_flavour_class_also_rejects_a_non_optimizer():
    with pytest.raises(TypeError, match="'sgd'"):
        KerasLossScaleOptimizer("sgd")


@pytest.mark.parametrize("dynamic", ["dynamic", None, np.bool_(True)],
                         ids=["string", "none", "numpy_bool"])
def test_non_bool_dynamic_raises_type_error(dynamic):
    with pytest.raises(TypeError, match="dynamic must be a bool") as e:
        tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(), dynamic)
    assert repr(dynamic) in str(e.value)
    with pytest.raises(TypeError, match="dynamic must be a bool") as e:
        tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(),
                                        dynamic=dynamic)


@pytest.mark.parametrize("args, scale, steps", [
    ((1024,), 1024.0, 2000), ((1,), 1.0, 2000), ((512.0, 10), 512.0, 10),
    ((np.float32(8), 3, "n"), 8.0, 3)])
def test_a_number_second_is_keras3s_initial_scale(args, scale, steps):
    # Keras 3's signature is (inner_optimizer, initial_scale,
    # dynamic_growth_steps, name): a number second can only mean that.
    ours = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(), *args)
    theirs = keras.mixed_precision.LossScaleOptimizer(
        keras.optimizers.SGD(), *args)
    assert (ours.dynamic, ours.initial_scale, ours.dynamic_growth_steps) == (
        True, scale, steps)
    assert (float(theirs.initial_scale), theirs.dynamic_growth_steps) == (
        scale, steps)
    assert float(ours.loss_scale) == float(theirs.scale_loss(1.0)) == scale
    if len(args) == 3:
        assert ours.name == theirs.name == "n"


def test_a_number_second_and_its_keyword_is_a_type_error_as_in_keras3():
    for cls in (tf_lossscale.LossScaleOptimizer,
                keras.mixed_precision.LossScaleOptimizer):
        with pytest.raises(TypeError, match="multiple values"):
            cls(keras.optimizers.SGD(), 1024, initial_scale=8)
    with pytest.raises(TypeError, match="at most"):
        tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(), 1, 2, "n", 4)


def test_a_number_second_keeps_a_dynamic_keyword_beside_it():
    # Keras 3 reads `dynamic=` beside a number second (and refuses a falsy
    # one); ours keeps it too: False is a fixed scale, never silently
    # dynamic, and a non-bool is the TypeError of any non-bool dynamic.
    fixed = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(), 4,
                                            dynamic=False)
    assert (fixed.dynamic, fixed.initial_scale) == (False, 4.0)
    with pytest.raises(TypeError, match="must be a bool, but got: None"):
        tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(), 4,
                                        dynamic=None)
    with pytest.raises(ValueError, match="dynamic=False"):
        keras.mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(), 4,
                                                 dynamic=False)


@pytest.mark.parametrize("kwargs, name", [
    ({"initial_scale": 0}, "initial_scale"),
    ({"initial_scale": -4.0}, "initial_scale"),
    ({"initial_scale": float("inf")}, "initial_scale"),
    ({"initial_scale": float("nan")}, "initial_scale"),
    ({"initial_scale": True}, "initial_scale"),
    ({"initial_scale": "big"}, "initial_scale"),
    ({"initial_scale": 1e39}, "initial_scale"),
    ({"dynamic_growth_steps": 0}, "dynamic_growth_steps"),
    ({"dynamic_growth_steps": 1.5}, "dynamic_growth_steps"),
    ({"dynamic_growth_steps": True}, "dynamic_growth_steps"),
    ({"dynamic": False}, "initial_scale"),
    ({"dynamic": False, "initial_scale": 0.5}, "initial_scale"),
    ({"dynamic": False, "initial_scale": 8, "dynamic_growth_steps": 5},
     "dynamic_growth_steps"),
], ids=lambda x: repr(x) if isinstance(x, dict) else x)
def test_bad_number_raises_value_error_naming_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(), **kwargs)


def test_inner_loss_scale_factor_is_neutralized_as_keras_does():
    for make in (tf_lossscale.LossScaleOptimizer,
                 keras.mixed_precision.LossScaleOptimizer):
        inner = keras.optimizers.SGD(1.0, loss_scale_factor=4.0)
        opt = make(inner, initial_scale=8.0)
        assert inner.loss_scale_factor is None
        var = keras.Variable([1.0])
        opt.apply([tf.constant([8.0])], [var])  # scaled by 8, not 32
        np.testing.assert_array_equal(var, [0.0])


@pytest.mark.parametrize("argument, value", [
    ("clipnorm", 1.0), ("use_ema", True), ("weight_decay", 0.1),
    ("gradient_accumulation_steps", 2)])
def test_base_optimizer_arguments_get_keras_value_error(argument, value):
    for make in (tf_lossscale.LossScaleOptimizer,
                 keras.mixed_precision.LossScaleOptimizer):
        with pytest.raises(ValueError, match=f"set `{argument}` on the "
                           "`inner_optimizer`"):
            make(keras.optimizers.SGD(), **{argument: value})


def test_base_optimizer_arguments_at_their_defaults_are_accepted():
    opt = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(), clipnorm=None, use_ema=False)
    assert opt.dynamic


# Hyperparameters and iterations read and write through.


def test_learning_rate_reads_and_writes_through_to_the_inner():
    opt = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(0.25))
    assert float(opt.learning_rate) == 0.25
    opt.learning_rate = 0.5
    assert float(opt.inner_optimizer.learning_rate) == 0.5


def test_other_hyperparameters_read_and_write_through_to_the_inner():
    opt = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.Adam(beta_1=0.8, clipnorm=2.0))
    assert (opt.beta_1, opt.clipnorm) == (0.8, 2.0)
    opt.beta_1 = 0.7
    opt.clipnorm = 3.0
    assert opt.inner_optimizer.beta_1 == 0.7
    assert opt.inner_optimizer.clipnorm == 3.0


def test_hyperparameter_the_inner_lacks_raises_attribute_error():
    opt = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD())
    assert not hasattr(opt, "beta_1")
    with pytest.raises(AttributeError, match="beta_1"):
        opt.beta_1 = 0.5
    assert not hasattr(opt.inner_optimizer, "beta_1")


def test_iterations_is_the_inner_optimizers():
    opt = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD())
    assert opt.iterations is opt.inner_optimizer.iterations


# get_scaled_loss / get_unscaled_gradients.


@pytest.mark.parametrize("dtype", [tf.float32, tf.float16])
def test_get_scaled_loss_multiplies_in_the_loss_dtype(dtype):
    opt = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(), initial_scale=8)
    scaled = opt.get_scaled_loss(tf.constant(1.5, dtype))
    assert scaled.dtype == dtype
    assert float(scaled) == 12.0


def test_get_scaled_loss_of_a_callable_is_a_callable():
    opt = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(), initial_scale=8)
    scaled = opt.get_scaled_loss(lambda: tf.constant(2.0))
    assert callable(scaled)
    assert float(scaled()) == 16.0


def test_get_unscaled_gradients_keeps_none_sparsity_and_dtypes():
    opt = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(), initial_scale=4)
    sparse = tf.IndexedSlices(tf.constant([[8.0, 4.0]]), tf.constant([1]),
                              tf.constant([3, 2]))
    dense16 = tf.constant([2.0, 6.0], tf.float16)
    none, got_sparse, got16 = opt.get_unscaled_gradients(
        [None, sparse, dense16])
    assert none is None
    assert isinstance(got_sparse, tf.IndexedSlices)
    np.testing.assert_array_equal(got_sparse.values, [[2.0, 1.0]])
    np.testing.assert_array_equal(got_sparse.indices, [1])
    assert got16.dtype == tf.float16
    np.testing.assert_array_equal(got16, [0.5, 1.5])


# Skip semantics.


@pytest.mark.parametrize("mode", WITH_XLA)
def test_finite_step_applies_the_unscaled_gradients(mode):
    var = keras.Variable([1.0, 2.0])
    opt = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(0.5), initial_scale=8)
    step = _runner(mode, lambda g: opt.apply_gradients([(g, var)]))
    step(tf.constant([8.0, -16.0]))  # Scaled by 8: [1, -2] unscaled.
    np.testing.assert_array_equal(var, [0.5, 3.0])
    assert int(opt.dynamic_counter) == 1


@pytest.mark.parametrize("mode", WITH_XLA)
def test_scale_and_counter_follow_the_reference_rule(mode):
    flags = [True, True, True, False, True, False, False, False, False,
             True, True, True, True, True, True, True]
    expected = _model.trajectory(flags, initial=4, period=3, multiplier=2)
    var = keras.Variable([1.0])
    opt = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(), initial_scale=4, dynamic_growth_steps=3)
    step = _runner(mode, lambda g: opt.apply_gradients([(g, var)]))
    got = []
    for flag in flags:
        step(tf.constant([1.0 if flag else np.nan]))
        got.append((float(opt.loss_scale), int(opt.dynamic_counter)))
    assert got == expected
    assert min(scale for scale, _ in got) == 1.0  # The floor was reached.
    assert int(opt.iterations) == len(flags)


def test_a_none_gradient_leaves_its_variable_alone():
    a, b = keras.Variable([1.0]), keras.Variable([1.0])
    opt = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(1.0), initial_scale=2)
    with pytest.warns(UserWarning, match="Gradients do not exist"):
        opt.apply_gradients([(tf.constant([2.0]), a), (None, b)])
    assert (float(a[0]), float(b[0])) == (0.0, 1.0)


@pytest.mark.parametrize("grad", [[1.0], [np.nan]], ids=["finite", "nan"])
def test_unknown_variable_raises_and_changes_nothing(grad):
    known, stranger = keras.Variable([1.0]), keras.Variable([1.0])
    opt = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(1.0), initial_scale=2)
    opt.build([known])
    with pytest.raises(ValueError, match="Unknown variable"):
        opt.apply_gradients([(tf.constant(grad), stranger)])
    assert (float(opt.loss_scale), int(opt.dynamic_counter)) == (2.0, 0)
    assert int(opt.iterations) == 0
    assert float(stranger[0]) == 1.0


@pytest.mark.parametrize("grad, error, match", [
    (tf.constant([1.0, 1.0, 1.0]), ValueError, r"'var' has shape \(3,\)"),
    (tf.constant([[1.0, 1.0]]), ValueError, r"\(1, 2\).*shape \(2,\)"),
    (tf.constant([8, 8]), TypeError, "'var' has dtype int32"),
    (tf.IndexedSlices(tf.constant([[8.0]]), tf.constant([0]),
                      tf.constant([2, 1])), ValueError, r"shape \(1,\)"),
], ids=["too_long", "extra_axis", "integer", "sparse_rows"])
@pytest.mark.parametrize("mode", MODES)
def test_gradient_that_does_not_fit_raises_and_changes_nothing(
        grad, error, match, mode):
    var = keras.Variable([1.0, 2.0], name="var")
    opt = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(1.0, momentum=0.5), initial_scale=8)
    opt.apply_gradients([(tf.constant([8.0, 8.0]), var)])
    before = _snapshot([var] + opt.variables)
    step = _runner(mode, lambda: opt.apply_gradients([(grad, var)]))
    with pytest.raises(error, match=match):
        step()
    assert _snapshot([var] + opt.variables) == before


def test_fixed_scale_skips_non_finite_gradients_and_keeps_its_scale():
    # A deliberate difference: the originals apply a NaN step when fixed.
    var = keras.Variable([1.0, 2.0])
    opt = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(1.0, momentum=0.5), dynamic=False,
        initial_scale=4)
    opt.apply_gradients([(tf.constant([4.0, 8.0]), var)])
    np.testing.assert_array_equal(var, [0.0, 0.0])
    momentum = [v for v in opt.inner_optimizer.variables
                if "momentum" in v.path][0]
    before = momentum.numpy().copy()
    opt.apply_gradients([(tf.constant([np.nan, 8.0]), var)])
    np.testing.assert_array_equal(var, [0.0, 0.0])
    np.testing.assert_array_equal(momentum, before)
    assert float(opt.loss_scale) == 4.0
    assert int(opt.iterations) == 2 and int(opt.skipped_steps) == 1


def test_a_step_traces_once_whatever_the_verdict():
    var = keras.Variable([1.0])
    opt = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(), initial_scale=4, dynamic_growth_steps=2)
    step = tf.function(lambda g: opt.apply_gradients([(g, var)]))
    for value in [1.0, np.nan, 1.0, 1.0, np.inf]:
        step(tf.constant([value]))
    assert step.experimental_get_tracing_count() == 1


@pytest.mark.parametrize("mode", WITH_XLA)
def test_a_finite_gradient_that_overflows_when_unscaled_is_skipped(mode):
    """Below a scale of 1 (a `min_scale` knob), dividing a finite gradient
    can overflow: the verdict is on what would be applied, in every mode
    (under XLA, the largest gradient divided as each one is)."""
    var = keras.Variable([1.0, 2.0])
    opt = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(1.0), initial_scale=0.25, min_scale=2.0**-8,
        dynamic_growth_steps=100)
    step = _runner(mode, lambda g: opt.apply_gradients([(g, var)]))
    step(tf.constant([3e38, 1.0]))  # 3e38 / 0.25 is +inf in float32.
    assert var.numpy().tolist() == [1.0, 2.0]
    assert (float(opt.loss_scale), int(opt.skipped_steps)) == (0.125, 1)
    step(tf.constant([2.0**-4, 3e37]))  # Finite: 3e37 / 0.125 < max.
    np.testing.assert_array_equal(var, [0.5, 2.0 - np.float32(3e37) * 8])


@pytest.mark.parametrize("mode", WITH_XLA)
def test_finite_gradients_whose_sum_overflows_are_applied(mode):
    """A sum of finite gradients may overflow (the cheap probe); the exact
    check then decides, and they are applied."""
    var = keras.Variable([0.0, 0.0, 0.0])
    opt = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(1.0), initial_scale=1, dynamic_growth_steps=100)
    step = _runner(mode, lambda g: opt.apply_gradients([(g, var)]))
    step(tf.constant([3e38, 3e38, -1.0]))
    np.testing.assert_array_equal(var, np.float32([-3e38, -3e38, 1.0]))
    assert int(opt.skipped_steps) == 0


def test_xla_compiled_step_skips_and_applies():
    var = keras.Variable([1.0, 2.0])
    opt = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(0.5, momentum=0.5), initial_scale=4)
    opt.build([var])
    step = tf.function(lambda g: opt.apply_gradients([(g, var)]),
                       jit_compile=True)
    step(tf.constant([4.0, 8.0]))
    before = _snapshot([var] + _slots(opt))
    step(tf.constant([np.nan, 8.0]))
    assert _snapshot([var] + _slots(opt)) == before
    assert (float(opt.loss_scale), int(opt.iterations)) == (2.0, 2)
    step(tf.constant([2.0, 4.0]))
    np.testing.assert_array_equal(var, [-0.25, -0.5])


# The two flows: documented (unscaled gradients) and Keras 3's (scaled).


def _linear_step(opt, var, coefficients, documented):
    """One step of loss = sum(coefficients * var), in either flow."""
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(coefficients * var)
        if documented:
            loss = opt.get_scaled_loss(loss)
        else:
            loss = opt.scale_loss(loss)
    grads = tape.gradient(loss, [var])
    if documented:
        grads = opt.get_unscaled_gradients(grads)
    opt.apply_gradients(zip(grads, [var]))


@pytest.mark.parametrize("mode", WITH_XLA)
def test_both_flows_and_switches_between_them_apply_unscaled_gradients(mode):
    var = keras.Variable([0.0, 0.0])
    opt = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(1.0), initial_scale=8, dynamic_growth_steps=2)
    coefficients = tf.constant([1.0, 2.0])
    documented = _runner(
        mode, lambda: _linear_step(opt, var, coefficients, True))
    keras_flow = _runner(
        mode, lambda: _linear_step(opt, var, coefficients, False))
    for n, step in enumerate(
            [documented, keras_flow, documented, documented, keras_flow,
             keras_flow], start=1):
        step()
        # Exactly one unscaled gradient per step, whatever the flow.
        np.testing.assert_array_equal(var, [-n, -2 * n])
    assert float(opt.loss_scale) == 64.0  # It grew every 2 steps.


@pytest.mark.parametrize("mode", WITH_XLA)
def test_documented_flow_may_change_gradients_before_applying(mode):
    var = keras.Variable([0.0, 0.0])
    opt = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(1.0), initial_scale=1024)

    def step():
        with tf.GradientTape() as tape:
            loss = opt.get_scaled_loss(
                tf.reduce_sum(tf.constant([3.0, 4.0]) * var))
        grads = opt.get_unscaled_gradients(tape.gradient(loss, [var]))
        grads, _ = tf.clip_by_global_norm(grads, 1.0)  # Norm 5 -> 1.
        opt.apply_gradients(zip(grads, [var]))

    _runner(mode, step)()
    np.testing.assert_allclose(var, [-0.6, -0.8], rtol=1e-6)


def test_unmarked_gradients_are_scaled_until_the_documented_flow_is_used():
    """Neither method ran where `apply_gradients` runs: Keras 3's flow
    (scaled) until `get_unscaled_gradients` has run anywhere; from then on
    TensorFlow's documented flow (unscaled), in every graph and eagerly."""
    var = keras.Variable([0.0])
    opt = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(1.0), initial_scale=4)
    opt.apply_gradients([(tf.constant([4.0]), var)])  # Scaled: 4 / 4.
    np.testing.assert_array_equal(var, [-1.0])
    opt.get_unscaled_gradients([tf.constant([1.0])])  # Eager, not applied.
    tf.function(lambda: opt.apply_gradients([(tf.constant([4.0]), var)]))()
    np.testing.assert_array_equal(var, [-5.0])  # Unscaled: 4.
    opt.apply_gradients([(tf.constant([1.0]), var)])
    np.testing.assert_array_equal(var, [-6.0])
    # A Keras 3 step still marks its own gradients as scaled.
    with tf.GradientTape() as tape:
        loss = opt.scale_loss(tf.reduce_sum(var * 2.0))
    opt.apply_gradients(zip(tape.gradient(loss, [var]), [var]))
    np.testing.assert_array_equal(var, [-8.0])


def test_first_unscaling_after_a_trace_took_unmarked_gradients_as_scaled():
    """That trace would keep dividing by the scale what the documented flow
    now means as unscaled: the first `get_unscaled_gradients` raises and
    changes nothing; an eager apply decides every call, and sets off
    nothing."""
    var = keras.Variable([0.0])
    opt = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(1.0), initial_scale=4)
    opt.apply_gradients([(tf.constant([4.0]), var)])  # Eagerly: no trace.
    apply = tf.function(lambda g: opt.apply_gradients([(g, var)]))
    apply(tf.constant([4.0]))  # Scaled: 4 / 4.
    for _ in range(2):
        with pytest.raises(RuntimeError, match=(
                r"first time after a tf.function had traced its "
                r"apply_gradients.* or use tf_lossscale.compat."
                r"LossScaleOptimizer, which applies unmarked gradients as "
                r"given")):
            opt.get_unscaled_gradients([tf.constant([8.0])])
    apply(tf.constant([4.0]))  # Still scaled, eagerly too.
    opt.apply_gradients([(tf.constant([4.0]), var)])
    np.testing.assert_array_equal(var, [-4.0])
    assert (int(opt.iterations), float(opt.loss_scale)) == (4, 4.0)


@pytest.mark.parametrize("public", ["current", "experimental"])
def test_accumulated_unscaled_gradients_applied_in_another_function(public):
    """TF 2.x trainers (OpenNMT-tf, ALBERT pretraining) unscale in one
    tf.function, accumulate, and apply in another: applied once unscaled."""
    var = keras.Variable([0.0, 0.0])
    if public == "current":
        opt = tf_lossscale.LossScaleOptimizer(
            keras.optimizers.SGD(1.0), initial_scale=2.0**15)
    else:
        with pytest.warns(DeprecationWarning):
            opt = tf_lossscale.experimental.LossScaleOptimizer(
                keras.optimizers.SGD(1.0), "dynamic")
    total = tf.Variable([0.0, 0.0])

    @tf.function
    def accumulate(coefficients):
        with tf.GradientTape() as tape:
            loss = opt.get_scaled_loss(tf.reduce_sum(coefficients * var))
        (grad,) = opt.get_unscaled_gradients(tape.gradient(loss, [var]))
        total.assign_add(grad)

    @tf.function
    def apply():
        opt.apply_gradients([(total / 2.0, var)])
        total.assign(tf.zeros_like(total))

    accumulate(tf.constant([1.0, 2.0]))
    accumulate(tf.constant([3.0, 4.0]))
    apply()
    np.testing.assert_array_equal(var, [-2.0, -3.0])
    assert int(opt.iterations) == 1
    assert float(opt.loss_scale) == 2.0**15


@pytest.mark.parametrize("public", ["current", "compat", "experimental"])
def test_accumulation_whose_apply_is_traced_first(public):
    """The apply function traced first (an apply of zero gradients): the
    current class cannot apply the accumulated gradients right, and says so
    at the first `get_unscaled_gradients`; the classes with TF 2.4-2.15's
    rule (unmarked gradients as given) train as TensorFlow did."""
    var = keras.Variable([1.0, 2.0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        opt = {"current": tf_lossscale.LossScaleOptimizer,
               "compat": tf_lossscale.compat.LossScaleOptimizer,
               "experimental": lambda o: tf_lossscale.experimental.
               LossScaleOptimizer(o, "dynamic")}[public](
            keras.optimizers.SGD(0.25))
    total = tf.Variable([0.0, 0.0])

    @tf.function
    def accumulate():
        with tf.GradientTape() as tape:
            loss = opt.get_scaled_loss(tf.reduce_sum(var * [1.0, 2.0]))
        (grad,) = opt.get_unscaled_gradients(tape.gradient(loss, [var]))
        total.assign_add(grad)

    @tf.function
    def apply():
        opt.apply_gradients([(total.read_value(), var)])
        total.assign(tf.zeros_like(total))

    apply()
    if public == "current":
        with pytest.raises(RuntimeError, match="traced its apply_gradients"):
            accumulate()
        np.testing.assert_array_equal(total, [0.0, 0.0])
        return
    accumulate()
    accumulate()
    apply()
    np.testing.assert_array_equal(var, [0.5, 1.0])
    assert int(opt.iterations) == 2


def test_experimental_class_takes_unmarked_gradients_as_unscaled():
    """As TF 2.4's class, its original, applied them."""
    var = keras.Variable([0.0])
    with pytest.warns(DeprecationWarning):
        opt = tf_lossscale.experimental.LossScaleOptimizer(
            keras.optimizers.SGD(1.0), 8)
    opt.apply_gradients([(tf.constant([2.0]), var)])
    tf.function(lambda: opt.apply_gradients([(tf.constant([2.0]), var)]))()
    np.testing.assert_array_equal(var, [-4.0])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("form", ["variable", "tuple", "callable"])
def test_minimize_takes_var_list_as_tensorflow_did(mode, form):
    """TF 2.2's docstring example passes one variable; TensorFlow also took
    a tuple, or a callable returning the variables (called after the loss,
    as OptimizerV2 did). Each gives what `[var]` gives."""
    var = keras.Variable([1.0, 2.0])
    opt = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(0.1),
                                          initial_scale=1024.0)
    var_list = {"variable": var, "tuple": (var,),
                "callable": lambda: [var]}[form]
    _runner(mode, lambda: opt.minimize(lambda: tf.reduce_sum(var ** 2),
                                       var_list=var_list))()
    np.testing.assert_allclose(var.numpy(), [0.8, 1.6], rtol=1e-6)
    assert int(opt.iterations) == 1


def test_minimize_refuses_what_is_not_a_variable_before_any_work():
    opt = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD())
    calls = []
    with pytest.raises(ValueError, match="Only variables can be trained"):
        opt.minimize(lambda: calls.append(1) or tf.constant(1.0),
                     var_list=tf.constant([1.0]))
    assert calls == [] and int(opt.iterations) == 0


def test_minimize_of_a_tensor_without_tape_raises():
    opt = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD())
    with pytest.raises(ValueError, match="needs a tape"):
        opt.minimize(tf.constant(1.0), [keras.Variable([1.0])])


# fit.


def _mixed_model():
    init = keras.initializers.GlorotUniform
    return keras.Sequential([
        keras.Input((4,)),
        keras.layers.Dense(8, activation="relu",
                           kernel_initializer=init(seed=1)),
        keras.layers.Dense(1, dtype="float32",
                           kernel_initializer=init(seed=2)),
    ])


@pytest.mark.parametrize("jit_compile", [False, True],
                         ids=["graph", "xla"])
def test_fit_under_mixed_float16_skips_overflows_and_counts_every_step(
        jit_compile):
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = _mixed_model()
        opt = tf_lossscale.LossScaleOptimizer(
            keras.optimizers.SGD(0.01), initial_scale=2.0**40,
            dynamic_growth_steps=1000)
        model.compile(optimizer=opt, loss="mse", jit_compile=jit_compile)
        rng = np.random.default_rng(0)
        x = rng.normal(size=(128, 4)).astype("float32")
        y = x.sum(axis=1, keepdims=True)
        history = model.fit(x, y, batch_size=16, epochs=2, verbose=0)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert model.optimizer is opt
    assert model.jit_compile is jit_compile
    assert int(opt.iterations) == 16  # Skipped steps counted too.
    # 2**40 overflows float16 at once: it backed off, and no step reached
    # growth, so counter + back-offs account for every step.
    backoffs = round(np.log2(2.0**40 / float(opt.loss_scale)))
    assert backoffs >= 1
    assert backoffs + int(opt.dynamic_counter) == 16
    assert all(np.isfinite(w).all() for w in model.get_weights())
    assert np.isfinite(history.history["loss"][-1])


@pytest.mark.parametrize("kind", ["ours", "keras"])
def test_learning_rate_schedule_stays_aligned_with_steps(kind):
    """A skipped step still counts, so the schedule sees the real step."""
    schedule = keras.optimizers.schedules.PiecewiseConstantDecay(
        [0], [1.0, 0.125])  # 1.0 at iterations 0, 0.125 from 1 on.
    inner = keras.optimizers.SGD(schedule)
    if kind == "ours":
        opt = tf_lossscale.LossScaleOptimizer(inner, initial_scale=4)
    else:
        opt = keras.mixed_precision.LossScaleOptimizer(inner, initial_scale=4)
    var = keras.Variable([0.0])
    opt.apply_gradients([(tf.constant([np.nan]), var)])  # Step 1: skipped.
    opt.apply_gradients([(tf.constant([2.0]), var)])  # Step 2: unscaled 1.
    if kind == "ours":
        np.testing.assert_array_equal(var, [-0.125])
        assert int(opt.iterations) == 2
    else:  # Keras 3.15 did not count the skipped step: a step-1 rate.
        np.testing.assert_array_equal(var, [-1.0])
        assert int(opt.iterations) == 1


@pytest.mark.parametrize("clip", [False, True], ids=["as_is", "clipped"])
def test_documented_flow_checks_changed_gradients_anew(
        monkeypatch, clip):
    """Handed exactly the outputs of get_unscaled_gradients, apply_gradients
    checks nothing again; changed gradients are checked anew."""
    from tf_lossscale import finite
    checks = []
    real = finite.check  # What a step calls to check unscaled gradients.
    monkeypatch.setattr(finite, "check",
                        lambda g, mode: checks.append(1) or real(g, mode))
    var = keras.Variable([1.0, 2.0])
    opt = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(0.25), initial_scale=1024.0)

    @tf.function
    def step(poison):
        with tf.GradientTape() as tape:
            loss = opt.get_scaled_loss(tf.reduce_sum(var * var))
        grads = opt.get_unscaled_gradients(tape.gradient(loss, [var]))
        grads = [tf.where(poison, np.nan, 1.0) * g for g in grads]
        if clip:
            grads, _ = tf.clip_by_global_norm(grads, 100.0)
        opt.apply_gradients(zip(grads, [var]))

    step(tf.constant(False))
    np.testing.assert_array_equal(var.numpy(), [0.5, 1.0])
    step(tf.constant(True))
    np.testing.assert_array_equal(var.numpy(), [0.5, 1.0])
    assert float(opt.loss_scale) == 512.0
    # The multiply by `poison` makes new tensors: rechecked in both cases.
    assert len(checks) == 1


def test_apply_of_the_very_unscaled_outputs_reuses_their_verdict(monkeypatch):
    from tf_lossscale import finite
    checks = []
    real = finite.check  # What a step calls to check unscaled gradients.
    monkeypatch.setattr(finite, "check",
                        lambda g, mode: checks.append(1) or real(g, mode))
    var = keras.Variable([1.0, 2.0])
    opt = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(0.25), initial_scale=4.0)
    for value, expected in ((8.0, [0.5, 1.5]), (np.nan, [0.5, 1.5])):
        grads = opt.get_unscaled_gradients([tf.constant([value, 8.0])])
        opt.apply_gradients(zip(grads, [var]))
        np.testing.assert_array_equal(var.numpy(), expected)
    assert checks == []
    assert (float(opt.loss_scale), int(opt.skipped_steps)) == (2.0, 1)


def test_from_config_leaves_the_callers_config_unchanged():
    opt = tf_lossscale.LossScaleOptimizer(keras.optimizers.Adam(0.5))
    config = opt.get_config()
    kept = repr(config)
    restored = tf_lossscale.LossScaleOptimizer.from_config(config)
    assert repr(config) == kept
    assert float(restored.learning_rate) == 0.5


def test_tensorflows_frozen_keras_optimizer_is_refused_naming_tf_keras():
    """TF still ships a private copy of Keras 2.4 (`tensorflow.python.keras`);
    its optimizers are no flavour's, and the error says which one to use.
    In a process of its own: importing that copy registers Keras objects."""
    code = (
        "from tensorflow.python.keras.optimizer_v2 import gradient_descent\n"
        "import tf_lossscale\n"
        "class MySGD(gradient_descent.SGD):\n"
        "    pass\n"
        "for cls in (gradient_descent.SGD, MySGD):\n"
        "    try:\n"
        "        tf_lossscale.LossScaleOptimizer(cls(0.5))\n"
        "    except TypeError as e:\n"
        "        print('TypeError:', e)\n")
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True,
        timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert result.returncode == 0, result.stderr[-3000:]
    messages = result.stdout.strip().splitlines()
    assert len(messages) == 2, result.stdout
    assert "of type tensorflow.python.keras.optimizer_v2" in messages[0]
    assert "of type __main__.MySGD" in messages[1]
    for message in messages:
        assert message.startswith(
            "TypeError: inner_optimizer must be a Keras 3")
        assert message.endswith(
            "is not supported: use the same optimizer from tf_keras."
            "optimizers.legacy (tf_keras.optimizers.legacy.SGD), which has "
            "its API.")


def test_the_keras_3_class_called_with_a_tf_keras_optimizer_names_the_class():
    import tf_keras

    inner = tf_keras.optimizers.SGD()
    with pytest.raises(TypeError) as e:
        KerasLossScaleOptimizer(inner)
    message = str(e.value)
    assert message.startswith(
        "KerasLossScaleOptimizer wraps one family of optimizers: only Keras "
        "3 optimizers")
    assert "of type tf_keras.src.optimizers.sgd.SGD" in message
    assert message.endswith(
        "Use tf_lossscale.LossScaleOptimizer, which builds the class for "
        "each family: for this one, tf_lossscale.tf_keras_optimizer."
        "TfKerasLossScaleOptimizer.")
    # The optimizer is left as it was: the public class wraps it.
    opt = tf_lossscale.LossScaleOptimizer(inner)
    assert type(opt).__name__ == "TfKerasLossScaleOptimizer"
