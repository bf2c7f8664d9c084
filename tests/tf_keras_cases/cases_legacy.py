"""The flavour for tf_keras' legacy optimizers, against tf_keras' own wrapper.

`tf_lossscale.LossScaleOptimizer(tf_keras.optimizers.legacy.X(...))` must be
a drop-in for `tf_keras.mixed_precision.LossScaleOptimizer` wrapping the same
optimizer (docs/differences.md). Most tests here run one scenario on both, each
with its own, equally configured inner optimizer and its own, equal model
variables, and compare what the user sees: weights, slots, `iterations`, the
scale and the counter after every step (hypothesis generates the step
sequences), return types, warnings, configs, checkpoints (both ways, with
`assert_consumed()`), saved models. Where a deliberate difference applies (a
fixed scale skips a NaN step; knobs; `skipped_steps`; attributes that are
not hyperparameters read through), the test asserts the difference.

Runs under TF_USE_LEGACY_KERAS=1 (see tests/_tf_keras_cases.py);
tests/conftest.py makes the two logical CPUs and the one MirroredStrategy.
"""

import copy
import os
import subprocess
import sys
import textwrap
import warnings
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf
import tf_keras
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensorflow.core.protobuf import trackable_object_graph_pb2
from tensorflow.python.platform import tf_logging
from tf_keras.src import optimizers as tf_keras_optimizers_src

import tf_lossscale
from tf_lossscale import optimizer as optimizer_lib
from tf_lossscale import tf_keras_legacy_optimizer

OURS = tf_lossscale.LossScaleOptimizer
THEIRS = tf_keras.mixed_precision.LossScaleOptimizer
LEGACY = tf_keras.optimizers.legacy
NAN, INF = float("nan"), float("inf")
HYPOTHESIS = dict(deadline=None, max_examples=25, derandomize=True,
                  suppress_health_check=[HealthCheck.too_slow])

INNERS = {
    "sgd": lambda: LEGACY.SGD(0.5),
    "momentum": lambda: LEGACY.SGD(0.25, momentum=0.9),
    "adam": lambda: LEGACY.Adam(0.1),
    "rmsprop": lambda: LEGACY.RMSprop(0.05, centered=True),
}


def _both(make_inner=INNERS["momentum"], **kwargs):
    """The same configuration on ours and on tf_keras' own wrapper."""
    return OURS(make_inner(), **kwargs), THEIRS(make_inner(), **kwargs)


def _runner(mode, fn):
    return tf.function(fn) if mode == "function" else fn


def _values(variables):
    return [np.asarray(v.numpy()).tolist() for v in variables]


def _bits(variables):
    return [np.asarray(v.numpy()).tobytes() for v in variables]


def _state(opt, variables):
    """Weights, the inner optimizer's variables, scale, counter, iterations."""
    return {
        "weights": _bits(variables),
        "optimizer": _bits(opt.inner_optimizer.variables()),
        "scale": float(opt.loss_scale),
        "counter": None if opt.dynamic_counter is None else int(
            opt.dynamic_counter),
        "iterations": int(opt.iterations.numpy()),
    }


def _documented_step(opt, variables, loss_fn):
    with tf.GradientTape() as tape:
        loss = opt.get_scaled_loss(loss_fn())
    grads = opt.get_unscaled_gradients(tape.gradient(loss, variables))
    return opt.apply_gradients(zip(grads, variables))


# Construction and attributes.


def test_a_legacy_inner_gives_the_legacy_flavour():
    opt = OURS(LEGACY.SGD())
    assert type(opt) is tf_keras_legacy_optimizer.TfKerasLegacyLossScaleOptimizer
    assert isinstance(opt, tf_lossscale.LossScaleOptimizer)
    assert isinstance(opt, tf_keras.mixed_precision.LossScaleOptimizer)
    assert isinstance(opt, LEGACY.Optimizer)
    assert not isinstance(opt, tf_keras.optimizers.Optimizer)
    with pytest.warns(DeprecationWarning, match="tf_lossscale.LossScale"):
        old = tf_lossscale.experimental.LossScaleOptimizer(LEGACY.SGD(), 8)
    assert type(old).__name__ == "TfKerasLegacyExperimentalLossScaleOptimizer"
    assert isinstance(old, tf_lossscale.experimental.LossScaleOptimizer)
    assert isinstance(old, type(opt))
    assert old.get_config() == OURS(
        LEGACY.SGD(), dynamic=False, initial_scale=8).get_config()


@pytest.mark.parametrize("kwargs", [
    {},
    {"initial_scale": 4, "dynamic_growth_steps": 3},
    {"initial_scale": 2.0, "dynamic_growth_steps": 2.0},
    {"dynamic": False, "initial_scale": 8},
])
def test_attributes_are_tf_keras_own(kwargs):
    ours, theirs = _both(**kwargs)
    for name in ("dynamic", "initial_scale", "dynamic_growth_steps"):
        assert getattr(ours, name) == getattr(theirs, name), name
        assert type(getattr(ours, name)) is type(getattr(theirs, name)), name
    assert isinstance(ours.loss_scale, tf.Tensor)
    assert ours.loss_scale.dtype == tf.float32
    assert float(ours.loss_scale) == float(theirs.loss_scale)
    if theirs.dynamic_counter is None:
        assert ours.dynamic_counter is None
    else:
        assert int(ours.dynamic_counter) == int(theirs.dynamic_counter) == 0
    assert ours.inner_optimizer is not theirs.inner_optimizer
    assert ours.get_config() == theirs.get_config()


@pytest.mark.parametrize("kwargs, error, match", [
    ({"dynamic": "dynamic"}, TypeError, "dynamic must be a bool"),
    ({"dynamic": False}, ValueError, "initial_scale is required"),
    ({"dynamic": False, "initial_scale": 1, "dynamic_growth_steps": 2},
     ValueError, "dynamic_growth_steps must be None"),
    ({"initial_scale": 0}, ValueError, "initial_scale"),
    ({"dynamic_growth_steps": 1.5}, ValueError, "dynamic_growth_steps"),
    ({"min_scale": 0}, ValueError, "min_scale"),
    ({"growth_factor": 1.0}, ValueError, "growth_factor"),
    ({"backoff_factor": 1.0}, ValueError, "backoff_factor"),
    ({"hysteresis": 0}, ValueError, "hysteresis"),
    ({"dynamic": False, "initial_scale": 8, "hysteresis": 2}, ValueError,
     "hysteresis.*dynamic"),
])
def test_bad_settings_raise_and_leave_the_inner_wrappable(kwargs, error,
                                                          match):
    inner = LEGACY.SGD()
    with pytest.raises(error, match=match):
        OURS(inner, **kwargs)
    assert OURS(inner).inner_optimizer is inner


@pytest.mark.parametrize("first", [OURS, THEIRS], ids=["ours", "tf_keras"])
def test_wrapping_a_wrapper_or_a_wrapped_inner_raises(first):
    inner = LEGACY.SGD()
    wrapper = first(inner)
    with pytest.raises(TypeError, match="cannot wrap another"):
        OURS(wrapper)
    with pytest.raises(ValueError, match="already wrapped"):
        OURS(inner)
    with pytest.raises(ValueError, match="already wrapped"):
        THEIRS(inner)
    with pytest.raises(TypeError, match="cannot wrap another"):
        THEIRS(OURS(LEGACY.SGD()))  # tf_keras' own check, on ours.


def test_central_storage_strategy_is_refused_as_by_tf_keras():
    strategy = tf.distribute.experimental.CentralStorageStrategy()
    with strategy.scope():
        for make in (OURS, THEIRS):
            with pytest.raises(ValueError, match="CentralStorageStrategy"):
                make(LEGACY.SGD())
    opt = OURS(LEGACY.SGD())
    with strategy.scope():
        var = tf.Variable(1.0)
        with pytest.raises(ValueError, match="CentralStorageStrategy"):
            strategy.run(lambda: opt.minimize(lambda: var * 2.0, [var]))
    assert int(opt.iterations) == 0


# Hyperparameters and the inner optimizer's state.


def test_hyperparameters_read_and_write_through_as_tf_keras_does():
    inner = LEGACY.Adam(learning_rate=1.0, beta_1=0.5, beta_2=0.9)
    opt = OURS(inner)
    inner.lr  # Creates the hyperparameter variables.  # noqa: B018
    assert opt.lr is inner.lr and opt.learning_rate is inner.lr
    assert opt.beta_1 is inner.beta_1 and float(opt.beta_1) == 0.5
    opt.beta_1 = 0.25
    assert float(inner.beta_1) == 0.25 and opt.beta_1 is inner.beta_1
    opt.lr = 2.0
    assert float(inner.learning_rate) == 2.0 and opt.lr is inner.lr
    opt._set_hyper("beta_2", 0.75)
    assert float(opt._get_hyper("beta_2")) == float(inner.beta_2) == 0.75
    assert {"learning_rate", "lr", "beta_1", "beta_2", "decay"} <= set(
        dir(opt))
    # Plain attributes of the built-in optimizers read through too (a
    # deliberate difference: tf_keras' wrapper hides them).
    assert opt.epsilon == inner.epsilon and opt.amsgrad is False
    with pytest.raises(AttributeError):
        THEIRS(LEGACY.Adam()).amsgrad  # noqa: B018


def test_a_hyperparameter_named_like_an_attribute_is_not_written_through():
    class WithLossScaleHyper(LEGACY.SGD):
        def __init__(self):
            super().__init__()
            self._set_hyper("loss_scale", 123.0)

    for make in (OURS, THEIRS):
        opt = make(WithLossScaleHyper())
        with pytest.raises(AttributeError):
            opt.loss_scale = 2.0
        assert float(opt.loss_scale) == 32768.0


def test_learning_rate_of_an_inner_that_wraps_another_reads_through():
    class Wrapping(LEGACY.Optimizer):
        def __init__(self):
            super().__init__("Wrapping")
            self.inner_optimizer = LEGACY.SGD(learning_rate=1.0)

        @property
        def learning_rate(self):
            return self.inner_optimizer.learning_rate

        @learning_rate.setter
        def learning_rate(self, value):
            self.inner_optimizer.learning_rate = value

        def get_config(self):
            return {}

    opt = OURS(Wrapping())
    assert float(opt.learning_rate) == 1.0
    opt.learning_rate = 2.0
    assert float(opt.inner_optimizer.inner_optimizer.learning_rate) == 2.0


@pytest.mark.parametrize("clip", ["clipnorm", "global_clipnorm", "clipvalue"])
def test_clipping_attributes_read_and_write_through(clip):
    inner = LEGACY.SGD(**{clip: 2.0})
    opt = OURS(inner)
    assert getattr(opt, clip) == 2.0
    setattr(opt, clip, 3.0)
    assert getattr(inner, clip) == 3.0


def test_iterations_weights_variables_and_slots_are_the_inner_ones():
    runs = []
    for make in (OURS, THEIRS):
        var = tf.Variable([1.0])
        opt = make(LEGACY.SGD(1.0, momentum=0.5), initial_scale=2.0,
                   dynamic_growth_steps=1)
        opt.minimize(lambda var=var: var * 2, [var])
        inner = opt.inner_optimizer
        assert opt.weights == inner.weights
        assert opt.variables() == inner.variables()
        assert opt.get_slot(var, "momentum") is inner.get_slot(
            var, "momentum")
        before = [w.tolist() for w in opt.get_weights()]
        opt.set_weights([np.array(5), np.array([0.25])])
        runs.append((before, _values(opt.weights),
                     [w.tolist() for w in opt.get_weights()],
                     opt.get_slot_names(), float(opt.loss_scale)))
    # iterations and the momentum slot; the scale is not a weight.
    assert runs[0] == runs[1] == (
        [1, [-2.0]], [5, [0.25]], [5, [0.25]], ["momentum"], 4.0)
    opt = OURS(LEGACY.SGD(2.0), dynamic=False, initial_scale=10.0)
    opt.iterations = 7
    assert opt.iterations == 7 and opt.inner_optimizer.iterations == 7


# Steps.


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("make_inner", list(INNERS.values()),
                         ids=list(INNERS))
def test_documented_flow_matches_tf_keras_step_by_step(mode, make_inner):
    factors = [1.0, 1.0, 1.0, NAN, 1.0, 1.0, INF, 1.0, 1.0, 1.0, NAN, 1.0]
    traces = []
    for make in (OURS, THEIRS):
        var = tf.Variable([1.0, -2.0])
        opt = make(make_inner(), initial_scale=4.0, dynamic_growth_steps=2)

        def step(factor, opt=opt, var=var):
            _documented_step(opt, [var],
                             lambda: tf.reduce_sum(var * var) * factor)

        step = _runner(mode, step)
        trace = []
        for factor in factors:
            step(tf.constant(factor))
            trace.append(_state(opt, [var]))
        traces.append(trace)
    assert traces[0] == traces[1]
    assert [s["scale"] for s in traces[0]] == [
        4.0, 8.0, 8.0, 4.0, 4.0, 8.0, 4.0, 4.0, 8.0, 8.0, 4.0, 4.0]
    assert traces[0][-1]["iterations"] == len(factors)


@st.composite
def _scenarios(draw):
    inner = draw(st.sampled_from(sorted(INNERS)))
    initial = draw(st.sampled_from([1.0, 2.0, 8.0, 2.0**15]))
    period = draw(st.sampled_from([1, 2, 3, 2.0]))
    steps = draw(st.lists(st.tuples(
        st.sampled_from([1.0, -0.5, 3.0, 1e-3, NAN, INF, -INF]),
        st.sampled_from([1.0, 2.0, -1.0]),
        st.sampled_from(["documented", "unmarked"])),
        min_size=1, max_size=8))
    return inner, initial, period, steps


def _flow_step(opt, var, emb, a, b, flow):
    """One step: the documented flow, or gradients with no scaling method.

    (The third flow, `get_scaled_loss` alone, is a deliberate difference:
    see `test_the_scaled_flow_is_unscaled_by_ours...`.)
    """
    def loss():
        return (tf.reduce_sum(var * var) * a
                + tf.reduce_sum(tf.gather(emb, [0, 2]) * b))

    if flow == "documented":
        return _documented_step(opt, [var, emb], loss)
    with tf.GradientTape() as tape:
        value = loss()
    grads = tape.gradient(value, [var, emb])
    return opt.apply_gradients(zip(grads, [var, emb]))


@settings(**HYPOTHESIS)
@given(_scenarios())
def test_generated_step_sequences_match_tf_keras(scenario):
    """Dense and sparse gradients, finite or not, in every flow."""
    inner, initial, period, steps = scenario
    traces = []
    for make in (OURS, THEIRS):
        var = tf.Variable([1.0, -2.0, 0.5])
        emb = tf.Variable(np.arange(8, dtype=np.float32).reshape(4, 2))
        opt = make(INNERS[inner](), initial_scale=initial,
                   dynamic_growth_steps=period)
        trace = []
        with mock.patch.object(tf_logging, "warning") as warn:
            for a, b, flow in steps:
                result = _flow_step(opt, var, emb, a, b, flow)
                trace.append((_state(opt, [var, emb]), result is None))
        trace.append([call[0][0][:70] for call in warn.call_args_list])
        traces.append(trace)
    assert traces[0] == traces[1]


def test_the_scaled_flow_is_unscaled_by_ours_where_tf_keras_applies_it_raw():
    """get_scaled_loss without get_unscaled_gradients (docs/differences.md).

    Both warn; ours takes those gradients as scaled and divides them, which
    is what the user meant; tf_keras applies them as they are.
    """
    results = []
    for make in (OURS, THEIRS):
        var = tf.Variable([1.0, 2.0])
        opt = make(LEGACY.SGD(0.25), initial_scale=1024.0)
        with mock.patch.object(tf_logging, "warning") as warn:
            with tf.GradientTape() as tape:
                loss = opt.get_scaled_loss(tf.reduce_sum(var * var))
            opt.apply_gradients(zip(tape.gradient(loss, [var]), [var]))
        assert "You forgot to call LossScaleOptimizer.get_unscaled_gradients" \
            "() before" in warn.call_args_list[0][0][0]
        results.append(var.numpy().tolist())
    assert results[0] == [0.5, 1.0]  # var - 0.25 * 2 * var
    assert results[1] == [1.0 - 512.0, 2.0 - 1024.0]


@pytest.mark.parametrize("calls, warned", [
    ((), "You forgot to call LossScaleOptimizer.get_scaled_loss() and "
         "LossScaleOptimizer.get_unscaled_gradients() before"),
    (("scale",), "You forgot to call "
                 "LossScaleOptimizer.get_unscaled_gradients() before"),
    (("unscale",), "You forgot to call LossScaleOptimizer.get_scaled_loss() "
                   "before"),
    (("scale", "unscale"), None),
])
def test_scaling_warnings_are_tf_keras_own(calls, warned):
    applied = []
    for make in (OURS, THEIRS):
        var = tf.Variable(1.0)
        opt = make(LEGACY.SGD(1.0))
        with mock.patch.object(tf_logging, "warning") as warn:
            if "scale" in calls:
                opt.get_scaled_loss(tf.constant(1.0))
            if "unscale" in calls:
                opt.get_unscaled_gradients([tf.constant(1.0)])
            opt.apply_gradients([(tf.constant(1.0), var)])
        if warned is None:
            warn.assert_not_called()
        else:
            assert warned in warn.call_args_list[0][0][0]
        applied.append(float(var.numpy()))
    if calls == ("scale",):
        # docs/differences.md: after get_scaled_loss alone, ours takes the
        # gradient as scaled; tf_keras applies it as it is.
        assert applied == [1.0 - 2.0**-15, 0.0]
    else:  # Unmarked or already unscaled: applied as they are, by both.
        assert applied == [0.0, 0.0]


def test_fixed_scale_skips_a_nan_step_where_tf_keras_applies_it():
    """A deliberate difference (docs/differences.md).

    Ours with the steps (1, NaN, 1) ends where tf_keras' wrapper ends with
    (1, 1), iterations apart; tf_keras' with (1, NaN, 1) ends in NaN.
    """
    def run(make, factors):
        var = tf.Variable([1.0, 2.0])
        opt = make(LEGACY.SGD(0.5, momentum=0.5), dynamic=False,
                   initial_scale=8)
        for factor in factors:
            _documented_step(opt, [var],
                             lambda var=var, f=factor: tf.reduce_sum(var) * f)
        return opt, var

    ours, ours_var = run(OURS, (1.0, NAN, 1.0))
    theirs, theirs_var = run(THEIRS, (1.0, 1.0))
    assert _values([ours_var]) == _values([theirs_var]) == [[-0.25, 0.75]]
    assert _values(ours.inner_optimizer.variables())[1:] == _values(
        theirs.inner_optimizer.variables())[1:]
    assert (int(ours.iterations), int(theirs.iterations)) == (3, 2)
    assert (int(ours.skipped_steps), float(ours.loss_scale)) == (1, 8.0)
    _, nan_var = run(THEIRS, (1.0, NAN, 1.0))
    assert np.isnan(nan_var.numpy()).all()


def test_knobs_change_the_rule_and_appear_in_the_config():
    var = tf.Variable([1.0])
    opt = OURS(LEGACY.SGD(0.5), initial_scale=8.0, dynamic_growth_steps=1,
               hysteresis=2, min_scale=4.0, max_scale=16.0)
    scales = []
    for grad in (1.0, 1.0, NAN, NAN, NAN, NAN, NAN):
        opt.apply_gradients([(tf.constant([grad]), var)])
        scales.append(float(opt.loss_scale))
    # Grows to the cap; the first NaN after a growth is only skipped.
    assert scales == [16.0, 16.0, 16.0, 8.0, 4.0, 4.0, 4.0]
    assert int(opt.skipped_steps) == 5 and int(opt.iterations) == 7
    config = opt.get_config()
    assert {k: config[k] for k in ("hysteresis", "min_scale", "max_scale")
            } == {"hysteresis": 2, "min_scale": 4.0, "max_scale": 16.0}
    assert OURS.from_config(config).get_config() == config


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_apply_gradients_returns_what_tf_keras_returns(mode):
    kinds = []
    for make in (OURS, THEIRS):
        var = tf.Variable([1.0])
        opt = make(LEGACY.SGD(1.0))

        def step(opt=opt, var=var):
            result = opt.apply_gradients([(tf.constant([1.0]), var)],
                                         name="step")
            kinds.append(type(result).__name__)

        with mock.patch.object(tf_logging, "warning"):
            _runner(mode, step)()
        assert var.numpy().tolist() == [0.0]
    # (A tf.function that creates variables is traced twice.)
    assert set(kinds) == ({"NoneType"} if mode == "eager" else {"Operation"})


def test_gradient_aggregator_runs_before_the_check():
    def poison_last(grads_and_vars):
        grads_and_vars = list(grads_and_vars)
        grad, var = grads_and_vars[-1]
        grads_and_vars[-1] = (grad * NAN, var)
        return grads_and_vars

    for make in (OURS, THEIRS):
        var = tf.Variable([1.0, 2.0])
        opt = make(LEGACY.SGD(1.0, gradient_aggregator=poison_last),
                   initial_scale=2, dynamic_growth_steps=2)
        opt.minimize(lambda var=var: var * 2, var_list=[var])
        assert var.numpy().tolist() == [1.0, 2.0]
        assert float(opt.loss_scale) == 1.0
        # Without aggregation the aggregator does not run.
        opt.apply_gradients([(tf.constant([1.0, 1.0]), var)],
                            experimental_aggregate_gradients=False)
        assert var.numpy().tolist() == [0.0, 1.0]


@pytest.mark.parametrize("clip", ["clipnorm", "global_clipnorm", "clipvalue"])
def test_clipping_applies_to_unscaled_gradients_and_inf_is_skipped(clip):
    traces = []
    for make in (OURS, THEIRS):
        var = tf.Variable([5.0])
        opt = make(LEGACY.SGD(2.0, **{clip: 2.0}), initial_scale=2,
                   dynamic_growth_steps=1)
        trace = []
        for factor in (4.0, 4.0, INF):
            opt.minimize(lambda var=var, f=factor: var * f, var_list=[var])
            trace.append((var.numpy().tolist(), float(opt.loss_scale)))
            setattr(opt, clip, 3.0)
        traces.append(trace)
    assert traces[0] == traces[1] == [([1.0], 4.0), ([-5.0], 8.0),
                                      ([-5.0], 4.0)]


def test_sparse_gradients_match_tf_keras():
    traces = []
    for make in (OURS, THEIRS):
        emb = tf.Variable(tf.ones([4, 2]))
        opt = make(LEGACY.Adam(0.5), initial_scale=4.0,
                   dynamic_growth_steps=1)
        trace = []
        for rows, scale in (([1, 1], 1.0), ([2], NAN), ([3, 0], 2.0)):
            _documented_step(opt, [emb], lambda emb=emb, r=rows, s=scale:
                             tf.reduce_sum(tf.gather(emb, r)) * s)
            trace.append(_state(opt, [emb]))
        traces.append(trace)
    assert traces[0] == traces[1]
    assert [s["scale"] for s in traces[0]] == [8.0, 4.0, 8.0]


def test_learning_rate_schedule_follows_iterations_across_skips():
    schedule = tf_keras.optimizers.schedules.PiecewiseConstantDecay(
        [1], [0.5, 0.25])
    var = tf.Variable([1.0])
    opt = OURS(LEGACY.SGD(schedule), initial_scale=1.0)

    @tf.function
    def step(grad):
        opt.apply_gradients([(grad, var)])
    with mock.patch.object(tf_logging, "warning"):
        step(tf.constant([NAN]))  # Skipped: iterations 0 -> 1.
        step(tf.constant([1.0]))  # Iteration 1: lr 0.5.
        step(tf.constant([1.0]))  # Iteration 2: lr 0.25.
    assert var.numpy().tolist() == [0.25]


# TF1 graphs.


def _in_graph(make, build):
    """Runs `build(opt, var)`'s ops in a TF1 graph twice; the final state."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        var = tf.Variable([5.0])
        opt = make(LEGACY.SGD(2.0, momentum=0.5), initial_scale=2,
                   dynamic_growth_steps=1)
        ops = build(opt, var)
        sess.run(tf.compat.v1.global_variables_initializer())
        for op in ops:
            sess.run(op)
        return (type(ops[0]).__name__, sess.run(var).tolist(),
                float(sess.run(opt.loss_scale)),
                int(sess.run(opt.iterations)),
                sess.run(opt.get_slot(var, "momentum")).tolist())


def test_minimize_in_a_tf1_graph_returns_the_op_of_the_step():
    def build(opt, var):
        finite = opt.minimize(lambda: var * 1.0, [var])
        nan = opt.minimize(lambda: var * NAN, [var])
        return [finite, finite, nan]

    ours, theirs = (_in_graph(make, build) for make in (OURS, THEIRS))
    # m = 0.5 * m - 2 * grad; var += m: 5 -> 3 -> 0, then a skipped step.
    assert ours == theirs == ("Operation", [0.0], 4.0, 3, [-3.0])


def test_get_gradients_in_a_tf1_graph_unscales():
    def build(opt, var):
        grads = opt.get_gradients(var * 3.0, [var])
        return [grads[0]] + [opt.apply_gradients(zip(grads, [var]))]

    ours, theirs = (_in_graph(make, build) for make in (OURS, THEIRS))
    assert ours[1:] == theirs[1:] == ([-1.0], 4.0, 1, [-6.0])
    assert ours[0] == theirs[0]  # A tensor.



def test_get_gradients_in_a_tf1_graph_scales_the_loss_as_tf_keras():
    """The gradient reaching the loss is the (fixed) scale; the result is
    unscaled."""
    results = []
    for make in (OURS, THEIRS):
        with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
            var = tf.Variable([2.0])
            opt = make(LEGACY.SGD(1.0), dynamic=False, initial_scale=10.0)
            seen = []

            @tf.custom_gradient
            def identity(x, seen=seen):
                def grad(upstream):
                    seen.append(upstream)
                    return upstream
                return tf.identity(x), grad

            (unscaled,) = opt.get_gradients(identity(var) * 3.0, [var])
            sess.run(tf.compat.v1.global_variables_initializer())
            results.append(sess.run([seen[0], unscaled]))
    assert [[r.tolist() for r in run] for run in results] == [
        [[30.0], [3.0]]] * 2


def _configs_of_either_class():
    """Configs from the experimental class, the current one and TF 2.3."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        experimental = {
            False: tf_lossscale.experimental.LossScaleOptimizer(
                LEGACY.SGD(2.0, momentum=0.5), 2),
            True: tf_lossscale.experimental.LossScaleOptimizer(
                LEGACY.SGD(2.0, momentum=0.5),
                tf_lossscale.DynamicLossScale(2, 3))}
    current = {
        False: OURS(LEGACY.SGD(2.0, momentum=0.5), dynamic=False,
                    initial_scale=2),
        True: OURS(LEGACY.SGD(2.0, momentum=0.5), initial_scale=2,
                   dynamic_growth_steps=3)}
    tf_2_3 = {
        False: {"class_name": "FixedLossScale",
                "config": {"loss_scale_value": 2.0}},
        True: {"class_name": "DynamicLossScale", "config": {
            "initial_loss_scale": 2.0, "increment_period": 3,
            "multiplier": 2.0}}}
    sgd = {"class_name": "SGD", "config": {
        "learning_rate": 2.0, "momentum": 0.5, "decay": 0.0,
        "nesterov": False, "name": "SGD"}}
    return {
        "experimental": {d: o.get_config() for d, o in experimental.items()},
        "current": {d: o.get_config() for d, o in current.items()},
        "tf_2_3": {d: {"optimizer": sgd, "loss_scale": ls}
                   for d, ls in tf_2_3.items()}}


@pytest.mark.parametrize("dynamic", [False, True], ids=["fixed", "dynamic"])
@pytest.mark.parametrize("reader", ["experimental", "current"])
@pytest.mark.parametrize("writer", ["experimental", "current", "tf_2_3"])
def test_configs_of_either_class_load_into_either_class(writer, reader,
                                                        dynamic):
    """TF 2.4's cross-class config tests, on the legacy family; the loaded
    optimizer is compared with tf_keras' own reading of the same config."""
    config = _configs_of_either_class()[writer][dynamic]
    cls = {"experimental": tf_lossscale.experimental.LossScaleOptimizer,
           "current": OURS}[reader]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        ours = cls.from_config(copy.deepcopy(config))
    theirs = tf_keras.optimizers.deserialize({
        "class_name": "LossScaleOptimizer", "config": copy.deepcopy(config)})
    assert isinstance(ours, cls)
    assert type(ours).__name__ == {
        "experimental": "TfKerasLegacyExperimentalLossScaleOptimizer",
        "current": "TfKerasLegacyLossScaleOptimizer"}[reader]
    results = []
    for opt in (ours, theirs):
        attributes = (float(opt.lr), float(opt.inner_optimizer.lr),
                      float(opt.momentum), float(opt.loss_scale),
                      opt.initial_scale, opt.dynamic_growth_steps,
                      opt.dynamic)
        var = tf.Variable([5.0])
        with tf.GradientTape() as tape:
            tape.watch(var)
            loss = opt.get_scaled_loss(var * 1.0)
        scaled = tape.gradient(loss, [var])
        opt.apply_gradients(zip(opt.get_unscaled_gradients(scaled), [var]))
        results.append((attributes, scaled[0].numpy().tolist(),
                        var.numpy().tolist(), None if (
                            opt.dynamic_counter is None) else int(
                                opt.dynamic_counter)))
        assert opt.get_config() == ours.get_config()
    assert results[0] == results[1] == (
        (2.0, 2.0, 0.5, 2.0, 2.0, 3 if dynamic else None, dynamic),
        [2.0], [3.0], 1 if dynamic else None)


# compile / fit.


TF1_KERAS_SCRIPT = textwrap.dedent("""
    import numpy as np
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    import tf_keras
    import tf_lossscale
    tf_keras.mixed_precision.set_global_policy("mixed_float16")
    x = np.random.default_rng(0).normal(size=(32, 3)).astype("float32")
    for make in (tf_lossscale.LossScaleOptimizer,
                 tf_keras.mixed_precision.LossScaleOptimizer):
        model = tf_keras.Sequential([
            tf_keras.layers.Dense(4, input_shape=(3,)),
            tf_keras.layers.Dense(1, dtype="float32")])
        model.set_weights([np.full(w.shape, 0.5, "float32")
                           for w in model.get_weights()])
        opt = make(tf_keras.optimizers.legacy.SGD(0.01),
                   initial_scale=2.0**20, dynamic_growth_steps=2)
        model.compile(optimizer=opt, loss="mse")
        model.fit(x, np.ones((32, 1), "float32"), batch_size=8, epochs=2,
                  verbose=0, shuffle=False)
        sess = tf.compat.v1.keras.backend.get_session()
        print(model.optimizer is opt, sess.run(opt.loss_scale),
              sess.run(opt.iterations),
              np.asarray(model.get_weights()[0]).tobytes().hex())
""")


def test_tf1_keras_models_keep_it_and_train_as_with_tf_keras():
    """`training_v1` (after disable_eager_execution) keeps only instances of
    tf_keras' own wrapper and scales the loss through them."""
    result = subprocess.run(
        [sys.executable, "-c", TF1_KERAS_SCRIPT], capture_output=True,
        text=True, timeout=600,
        env={**os.environ, "TF_USE_LEGACY_KERAS": "1",
             "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0, result.stderr[-5000:]
    ours, theirs = result.stdout.split("\n")[:2]
    assert ours == theirs
    kept, scale, iterations, _ = ours.split()
    assert (kept, iterations) == ("True", "8")
    assert float(scale) < 2.0**20  # float16 overflowed: skipped, halved.


def _data(n=32):
    rng = np.random.default_rng(0)
    return (rng.normal(size=(n, 3)).astype("float32"),
            rng.normal(size=(n, 1)).astype("float32"))


def _fit(make, epochs=2, **kwargs):
    model = tf_keras.Sequential([
        tf_keras.layers.Dense(8, activation="relu", input_shape=(3,)),
        tf_keras.layers.Dense(1, dtype="float32")])
    rng = np.random.default_rng(1)  # The same weights for every run.
    model.set_weights([rng.normal(size=w.shape).astype("float32")
                       for w in model.get_weights()])
    opt = make(LEGACY.Adam(0.01), **kwargs)
    model.compile(optimizer=opt, loss="mse")
    x, y = _data()
    history = model.fit(x, y, batch_size=8, epochs=epochs, verbose=0,
                        shuffle=False)
    return model, opt, history.history["loss"]


def test_fit_under_mixed_float16_keeps_it_and_matches_tf_keras(mixed_float16):
    runs = []
    for make in (OURS, THEIRS):
        model, opt, losses = _fit(make, initial_scale=2.0**20,
                                  dynamic_growth_steps=3)
        assert model.optimizer is opt
        assert model.layers[0].compute_dtype == "float16"
        runs.append((_bits(model.weights), _state(opt, []), losses))
    assert runs[0] == runs[1]
    state = runs[0][1]
    assert state["iterations"] == 8 and state["scale"] < 2.0**20


def test_compile_under_mixed_float16_wraps_a_bare_legacy_optimizer_in_theirs(
        mixed_float16):
    """What compile does to a bare optimizer is tf_keras' business."""
    model = tf_keras.Sequential([tf_keras.layers.Dense(1, input_shape=(3,))])
    model.compile(optimizer=LEGACY.SGD(), loss="mse")
    assert isinstance(model.optimizer, THEIRS)


def test_fit_without_a_policy_matches_tf_keras():
    runs = [_fit(make, epochs=1, initial_scale=4.0, dynamic_growth_steps=2)
            for make in (OURS, THEIRS)]
    (m0, o0, l0), (m1, o1, l1) = runs
    assert _bits(m0.weights) == _bits(m1.weights) and l0 == l1
    assert _state(o0, []) == _state(o1, []) and int(o0.iterations) == 4
    assert float(o0.loss_scale) == 16.0


# Configs.


def test_config_is_tf_keras_own_and_loads_both_ways():
    ours, theirs = _both(lambda: LEGACY.SGD(0.5, momentum=0.9, name="s"),
                         initial_scale=64, dynamic_growth_steps=10)
    config = ours.get_config()
    assert config == theirs.get_config()
    assert config["inner_optimizer"]["module"] == "keras.optimizers.legacy"
    for loaded in (OURS.from_config(config), type(ours).from_config(config),
                   OURS.from_config(theirs.get_config())):
        assert type(loaded) is type(ours)
        assert loaded.get_config() == config
    # (tf_keras' from_config lowercases the class name in the config it is
    # given; ours copies it first.)
    theirs_loaded = type(theirs).from_config(copy.deepcopy(config))
    assert theirs_loaded.get_config() == config


@pytest.mark.parametrize("custom", [False, True])
def test_serialize_deserialize_round_trips(custom):
    class MySGD(LEGACY.SGD):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.my_attribute = 123

    inner = MySGD(2.0, momentum=0.5) if custom else LEGACY.SGD(
        2.0, momentum=0.5)
    opt = OURS(inner, initial_scale=2.0, dynamic_growth_steps=3.0)
    config = tf_keras.optimizers.serialize(opt)
    assert config["registered_name"] == "tf_lossscale>LegacyLossScaleOptimizer"
    loaded = tf_keras.optimizers.deserialize(
        config, custom_objects={"MySGD": MySGD} if custom else None)
    assert type(loaded) is type(opt) and type(loaded.inner_optimizer) is type(
        inner)
    assert loaded.get_config() == opt.get_config()
    assert (float(loaded.loss_scale), loaded.dynamic_growth_steps) == (2.0, 3)
    var = tf.Variable([5.0])
    loaded.minimize(lambda: var * 1.0, [var])
    assert var.numpy().tolist() == [3.0] and int(loaded.dynamic_counter) == 1


def test_each_inner_config_is_read_by_exactly_one_flavour():
    """The registry's `_reads`: tf_keras' own rule under legacy Keras."""
    configs = {
        "legacy": tf_keras.optimizers.serialize(LEGACY.SGD()),
        "current": tf_keras.optimizers.serialize(tf_keras.optimizers.SGD()),
        "tf_2_3": {"class_name": "SGD", "config": {
            "name": "SGD", "learning_rate": 0.5, "decay": 0.0}},
        "keras_3": {"module": "keras.optimizers", "class_name": "SGD",
                    "config": {"name": "SGD", "learning_rate": 0.5},
                    "registered_name": None},
    }
    flavours = optimizer_lib._REGISTRY[tf_lossscale.LossScaleOptimizer]
    readers = {name: [f.__name__ for _, f in flavours if f._reads(config)]
               for name, config in configs.items()}
    assert readers == {
        "legacy": ["TfKerasLegacyLossScaleOptimizer"],
        "current": ["TfKerasLossScaleOptimizer"],
        "tf_2_3": ["TfKerasLegacyLossScaleOptimizer"],
        # tf_keras deserializes it (its own rule), as a legacy optimizer.
        "keras_3": ["TfKerasLegacyLossScaleOptimizer"],
    }


def test_each_flavour_is_registered_once_and_imported_once():
    """No flavour module ran twice (a half-failed nested import did)."""
    for public in (tf_lossscale.LossScaleOptimizer,
                   tf_lossscale.experimental.LossScaleOptimizer):
        flavours = [f for _, f in optimizer_lib._REGISTRY[public]]
        assert sorted(f.__name__ for f in flavours) == sorted(
            {f.__name__ for f in flavours})
        assert len(flavours) == 3
        for flavour in flavours:
            module = sys.modules[flavour.__module__]
            assert getattr(module, flavour.__name__) is flavour


def test_converter_to_the_legacy_family_converts_ours():
    """tf_keras.optimizers.convert_to_legacy_optimizer (R8)."""
    class Halving(tf_keras.optimizers.schedules.LearningRateSchedule):
        def __call__(self, step):
            return 1.0 / (tf.cast(step, tf.float32) + 1)

        def get_config(self):
            return {}

    convert = tf_keras_optimizers_src.convert_to_legacy_optimizer
    for rate in (1.0, Halving()):
        ours = OURS(tf_keras.optimizers.SGD(rate), initial_scale=16.0)
        converted = convert(ours)
        assert type(converted) is type(OURS(LEGACY.SGD()))
        reference = OURS(LEGACY.SGD(rate), initial_scale=16.0)
        assert converted.get_config() == reference.get_config()
        theirs = convert(THEIRS(tf_keras.optimizers.SGD(rate),
                                initial_scale=16.0))
        assert converted.get_config() == theirs.get_config()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old = tf_lossscale.experimental.LossScaleOptimizer(
            tf_keras.optimizers.SGD(1.0), 128)
        converted = convert(old)
    assert type(converted).__name__ == (
        "TfKerasLegacyExperimentalLossScaleOptimizer")
    assert (converted.dynamic, converted.initial_scale) == (False, 128.0)


# Checkpoints.


def _trained(make):
    """A variable and an optimizer after 3 finite steps and one NaN step.

    (`make=None`: the bare inner optimizer, after the 3 finite steps.)
    """
    var = tf.Variable([1.0, 2.0])
    if make is None:
        opt = LEGACY.SGD(0.125, momentum=0.5)
        for factor in (1.0, -2.0, 0.5):
            opt.minimize(lambda f=factor: tf.reduce_sum(var * var) * f,
                         [var])
        return var, opt
    opt = make(LEGACY.SGD(0.125, momentum=0.5), initial_scale=8.0,
               dynamic_growth_steps=2)
    for factor in (1.0, -2.0, NAN, 0.5):
        _documented_step(opt, [var],
                         lambda f=factor: tf.reduce_sum(var * var) * f)
    return var, opt


def _fresh(make):
    var = tf.Variable([0.0, 0.0])
    inner = LEGACY.SGD(0.125, momentum=0.5)
    opt = make(inner, initial_scale=8.0, dynamic_growth_steps=2) if make \
        else inner
    opt._create_all_weights([var])
    return var, opt


def _checkpoint_state(var, opt):
    inner = getattr(opt, "inner_optimizer", opt)
    return (var.numpy().tolist(), _values(inner.variables()),
            float(getattr(opt, "loss_scale", 0.0)))


@pytest.mark.parametrize("writer, reader", [
    (OURS, OURS), (OURS, THEIRS), (THEIRS, OURS)],
    ids=["ours_to_ours", "ours_to_tf_keras", "tf_keras_to_ours"])
def test_checkpoints_restore_both_ways_with_assert_consumed(tmp_path, writer,
                                                            reader):
    var, opt = _trained(writer)
    assert (float(opt.loss_scale), int(opt.dynamic_counter),
            int(opt.iterations)) == (8.0, 1, 4)
    path = tf.train.Checkpoint(var=var, optimizer=opt).write(
        str(tmp_path / "ckpt"))
    new_var, new_opt = _fresh(reader)
    tf.train.Checkpoint(var=new_var, optimizer=new_opt).read(
        path).assert_consumed()
    assert _checkpoint_state(new_var, new_opt) == _checkpoint_state(var, opt)
    assert int(new_opt.dynamic_counter) == 1


def test_checkpoint_keys_and_objects_are_tf_keras_own(tmp_path):
    keys = []
    for make in (OURS, THEIRS):
        var, opt = _trained(make)
        path = tf.train.Checkpoint(var=var, optimizer=opt).write(
            str(tmp_path / make.__name__))
        reader = tf.train.load_checkpoint(path)
        graph = trackable_object_graph_pb2.TrackableObjectGraph()
        graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
        (node,) = [c.node_id for c in graph.nodes[0].children
                   if c.local_name == "optimizer"]
        children = sorted(c.local_name for c in graph.nodes[node].children)
        keys.append((sorted(n for n, _ in tf.train.list_variables(path)),
                     children))
    assert keys[0] == keys[1]
    assert "base_optimizer" in keys[0][1] and "loss_scale" in keys[0][1]


@pytest.mark.parametrize("wrapper", [OURS, THEIRS], ids=["ours", "tf_keras"])
def test_checkpoints_of_the_bare_inner_optimizer_interchange(tmp_path,
                                                             wrapper):
    """As with tf_keras' wrapper: the slots and iterations, not the scale.

    Neither direction can pass `assert_consumed()` (one side has a loss
    scale, the other none); both pass what tf_keras' own tests check.
    """
    for writer, reader in ((None, wrapper), (wrapper, None)):
        var, opt = _trained(writer)
        path = tf.train.Checkpoint(var=var, optimizer=opt).write(
            str(tmp_path / f"{writer is None}_{wrapper.__name__}"))
        new_var, new_opt = _fresh(reader)
        status = tf.train.Checkpoint(var=new_var, optimizer=new_opt).read(
            path)
        if reader is None:
            status.assert_existing_objects_matched()
        else:
            status.assert_nontrivial_match()
            assert float(new_opt.loss_scale) == 8.0  # Its initial scale.
        with pytest.raises(AssertionError):
            status.assert_consumed()
        inner = getattr(new_opt, "inner_optimizer", new_opt)
        assert _values(inner.variables()) == _values(
            getattr(opt, "inner_optimizer", opt).variables())
        assert new_var.numpy().tolist() == var.numpy().tolist()


# Saving.


def _saved_and_loaded(make, tmp_path, filename):
    model, opt, _ = _fit(make, initial_scale=2.0**10,
                         dynamic_growth_steps=3)
    path = str(tmp_path / f"{make.__name__}_{filename}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save(path, save_format="tf" if filename == "sm" else None)
    loaded = tf_keras.models.load_model(path)
    if filename == "sm":
        loaded.load_weights(os.path.join(path, "variables", "variables"))
    return opt, loaded.optimizer


@pytest.mark.parametrize("filename", ["m.h5", "m.keras", "sm"])
def test_saved_models_load_as_tf_keras_own_wrapper_loads(tmp_path,
                                                         mixed_float16,
                                                         filename):
    runs = []
    for make in (OURS, THEIRS):
        saved, loaded = _saved_and_loaded(make, tmp_path, filename)
        assert type(loaded) is type(saved)
        assert loaded.get_config() == saved.get_config()
        runs.append((float(loaded.loss_scale), int(loaded.iterations),
                     [w.tolist() for w in loaded.get_weights()]))
    assert runs[0] == runs[1]
    # h5 keeps the inner optimizer's weights (not the scale); a SavedModel
    # restores them from its variables; tf_keras' .keras keeps no state of
    # a legacy optimizer.
    assert runs[0][1] == {"m.h5": 8, "m.keras": 0, "sm": 8}[filename]


# MirroredStrategy.


def _distributed_step(strategy, opt, var, documented):
    def replica_step(poison):
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        with tf.GradientTape() as tape:
            loss = opt.get_scaled_loss(tf.reduce_sum(var * var))
        grads = tape.gradient(loss, [var])
        if documented:
            grads = opt.get_unscaled_gradients(grads)
        bad = tf.logical_and(poison, tf.equal(replica, 1))
        grads = [tf.where(bad, g * NAN, g) for g in grads]
        opt.apply_gradients(zip(grads, [var]))

    return tf.function(
        lambda poison: strategy.run(replica_step, args=(poison,)))


def _replicas(value):
    return [np.asarray(v.numpy()).tolist() for v in value.values]


def test_nan_on_one_replica_makes_every_replica_skip_as_in_tf_keras(
        mirrored_strategy):
    traces = []
    for make in (OURS, THEIRS):
        with mirrored_strategy.scope():
            var = tf.Variable([1.0, 2.0])
            opt = make(LEGACY.SGD(0.125, momentum=0.5), initial_scale=8.0,
                       dynamic_growth_steps=2)
        step = _distributed_step(mirrored_strategy, opt, var, True)
        trace = []
        with mock.patch.object(tf_logging, "warning"):
            for poison in (False, True, False):
                step(tf.constant(poison))
                trace.append((_replicas(var), _replicas(
                    opt.get_slot(var, "momentum")),
                    _replicas(opt.iterations), float(opt.loss_scale)))
        traces.append(trace)
    assert traces[0] == traces[1]
    # Summed over 2 replicas: var - 0.125 * 4 * var; then skipped; then on.
    assert traces[0][0][0] == [[0.5, 1.0]] * 2
    assert traces[0][1][0] == traces[0][0][0]
    assert [t[3] for t in traces[0]] == [8.0, 4.0, 4.0]


def test_the_scaled_flow_under_mirrored_strategy_unscales(mirrored_strategy):
    with mirrored_strategy.scope():
        var = tf.Variable([1.0, 2.0])
        opt = OURS(LEGACY.SGD(0.125), initial_scale=8.0)
    step = _distributed_step(mirrored_strategy, opt, var, False)
    with mock.patch.object(tf_logging, "warning"):
        step(tf.constant(False))
        step(tf.constant(True))
    assert _replicas(var) == [[0.5, 1.0]] * 2
    assert (float(opt.loss_scale), int(opt.skipped_steps)) == (4.0, 1)


def test_fit_under_mirrored_strategy_matches_tf_keras(mirrored_strategy,
                                                      mixed_float16):
    runs = []
    for make in (OURS, THEIRS):
        with mirrored_strategy.scope():
            model, opt, losses = _fit(make, epochs=1, initial_scale=2.0**40)
        assert model.optimizer is opt
        kernel = _replicas(model.layers[0].kernel)
        assert kernel[0] == kernel[1]
        runs.append((kernel[0], losses, int(opt.iterations.numpy()),
                     float(opt.loss_scale)))
    assert runs[0] == runs[1]
    assert runs[0][2] == 4 and runs[0][3] < 2.0**40


# TF1 graphs, with the default strategy and under MirroredStrategy.


def _fixed_minimize_in_a_tf1_graph(make, strategy):
    """SGD(2.0) with a fixed scale of 10 on `var = [5.0]`, one `minimize` of
    `probe(var) / replicas` in a TF1 graph, where `probe` is the identity
    whose gradient function keeps what reaches it. Per replica: what
    `minimize` returned, the gradient reaching the loss, the variable and
    `iterations`; and the scale."""
    replicas = strategy.num_replicas_in_sync
    returned = []
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        with strategy.scope():
            var = tf.Variable([5.0])
            opt = make(LEGACY.SGD(2.0), dynamic=False, initial_scale=10.0)

        def replica_step():
            reached = []

            @tf.custom_gradient
            def probe(x):
                def grad(upstream):
                    reached.append(upstream)
                    return upstream
                return tf.identity(x), grad

            op = opt.minimize(lambda: probe(var) / replicas, [var])
            returned.append(type(op).__name__)
            with tf.control_dependencies([op]):
                return tf.identity(reached[0])

        local = strategy.experimental_local_results
        reached = local(strategy.run(replica_step))
        sess.run(tf.compat.v1.global_variables_initializer())
        reached = sess.run(reached)
        return (returned, [r.tolist() for r in reached],
                [v.tolist() for v in sess.run(local(var))],
                [int(i) for i in sess.run(local(opt.iterations))],
                float(sess.run(opt.loss_scale)))


@pytest.mark.parametrize("distributed", [False, True],
                         ids=["default", "mirrored"])
def test_minimize_with_a_fixed_scale_in_a_tf1_graph_as_tf_keras(
        mirrored_strategy, distributed):
    strategy = (mirrored_strategy if distributed
                else tf.distribute.get_strategy())
    n = strategy.num_replicas_in_sync
    ours, theirs = (_fixed_minimize_in_a_tf1_graph(make, strategy)
                    for make in (OURS, THEIRS))
    assert ours == theirs
    # The gradient reaching the loss is the scale over the replicas; the
    # unscaled gradients (1 per replica) are summed: 5 - 2 * 1 = 3.
    assert ours == (["Operation"] * n, [[10.0 / n]] * n, [[3.0]] * n,
                    [1] * n, 10.0)
    # What `strategy.run` returns differs under MirroredStrategy (a
    # PerReplica of ops on ours, one Operation on tf_keras'): a strict xfail
    # in tests/test_differential_v1.py, as this module's runner refuses
    # xfails.


def test_the_inner_apply_gradients_gets_plain_tensors_in_a_tf1_graph(
        mirrored_strategy):
    """In a TF1 graph under MirroredStrategy an inner legacy optimizer that
    overrides apply_gradients sees tensors, not PerReplica values, once per
    replica, and it is the one that applies the step."""
    strategy, seen = mirrored_strategy, []

    class Recording(LEGACY.SGD):
        def apply_gradients(self, grads_and_vars, name=None,
                            experimental_aggregate_gradients=True):
            grads_and_vars = list(grads_and_vars)
            seen.append([type(g) for g, _ in grads_and_vars])
            return super().apply_gradients(
                grads_and_vars, name, experimental_aggregate_gradients)

    results = []
    for make in (OURS, THEIRS):
        seen.clear()
        with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
            with strategy.scope():
                var = tf.Variable([5.0])
                opt = make(Recording(learning_rate=1.0), dynamic=False,
                           initial_scale=1)
            local = strategy.experimental_local_results
            ops = local(strategy.run(
                lambda opt=opt, var=var: opt.minimize(
                    lambda: var * 2.0, [var])))
            assert seen and all(issubclass(t, tf.Tensor)
                                for types in seen for t in types), seen
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(ops)
            results.append((len(seen), [v.tolist() for v in sess.run(
                local(var))], [int(i) for i in sess.run(
                    local(opt.iterations))]))
    assert results[0] == results[1]
    # Once per replica; the gradient 2 of each replica, summed: 5 - 1 * 4.
    assert results[0] == (2, [[1.0], [1.0]], [1, 1])


@pytest.mark.parametrize("family", ["legacy", "current"])
def test_experimental_get_gradients_equals_the_original_s(family):
    """TF 2.1-2.3's `get_gradients(loss, params)` on the experimental
    class, for both tf_keras optimizer families, against tf_keras' own
    wrapper of a legacy optimizer at the same fixed scale."""
    inner = (LEGACY.SGD(1.0) if family == "legacy"
             else tf_keras.optimizers.SGD(1.0))
    with pytest.warns(DeprecationWarning):
        ours = tf_lossscale.experimental.LossScaleOptimizer(inner, 1024)
    original = tf_keras.mixed_precision.LossScaleOptimizer(
        LEGACY.SGD(1.0), dynamic=False, initial_scale=1024)
    v = tf.Variable([1.0, 2.0])
    w = tf.Variable(3.0)

    @tf.function
    def gradients(opt):
        return opt.get_gradients(tf.reduce_sum(v * v) * w, [v, w])

    mine, theirs = gradients(ours), gradients(original)
    for a, b in zip(mine, theirs):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(mine[0], [6.0, 12.0])
    assert float(mine[1]) == 5.0
