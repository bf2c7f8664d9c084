"""The tf_keras flavour under MirroredStrategy over two logical CPUs.

Runs under TF_USE_LEGACY_KERAS=1 (see tests/_tf_keras_cases.py);
tests/conftest.py makes the two CPUs and the one strategy of the process.
The tests that hold on both Kerases are written once, in
tests/_both_distributed.py, and run here on tf_keras (imported below).
"""

import warnings

import numpy as np
import pytest
import tensorflow as tf
import tf_keras
from _both_distributed import *  # noqa: F403 (the tests on both Kerases)
from _gradient_check import identity_checking_its_gradient

import tf_lossscale


def _build(strategy, make=tf_lossscale.LossScaleOptimizer):
    with strategy.scope():
        var = tf.Variable([1.0, 2.0])
        opt = make(tf_keras.optimizers.SGD(0.125, momentum=0.5),
                   initial_scale=8.0, dynamic_growth_steps=2)
        opt.build([var])
    return var, opt


def _train_step(strategy, opt, var, documented):
    """A traced step whose gradients are NaN on replica 1 only if `poison`."""

    def replica_step(poison):
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(var * var)
            # Either way the loss is scaled; only the documented flow
            # unscales before apply_gradients (else it takes them as scaled).
            loss = opt.get_scaled_loss(loss)
        grads = tape.gradient(loss, [var])
        if documented:
            grads = opt.get_unscaled_gradients(grads)
        bad = tf.logical_and(poison, tf.equal(replica, 1))
        grads = [tf.where(bad, g * np.nan, g) for g in grads]
        opt.apply_gradients(zip(grads, [var]))

    return tf.function(
        lambda poison: strategy.run(replica_step, args=(poison,)))


def _replicas(variable):
    return [v.numpy() for v in variable.values]


def _momentum(opt):
    (slot,) = [v for v in opt.inner_optimizer.variables
               if v.name.startswith("m/")]  # tf_keras' SGD momentum.
    return _replicas(slot)


@pytest.mark.parametrize("documented", [True, False],
                         ids=["documented", "scaled"])
def test_nan_on_one_replica_makes_every_replica_skip(mirrored_strategy,
                                                     documented):
    var, opt = _build(mirrored_strategy)
    step = _train_step(mirrored_strategy, opt, var, documented)
    step(tf.constant(False))
    # Both replicas' gradients (2 * var) are summed: var - 0.125 * 4 * var.
    for replica in _replicas(var):
        np.testing.assert_array_equal(replica, [0.5, 1.0])
    weights, slots = _replicas(var), _momentum(opt)
    step(tf.constant(True))
    for before, after in zip(weights + slots, _replicas(var) + _momentum(opt)):
        np.testing.assert_array_equal(after.view(np.uint8),
                                      before.view(np.uint8))
    assert [float(s) for s in _replicas(opt.dynamic_scale)] == [4.0, 4.0]
    assert [int(c) for c in _replicas(opt.step_counter)] == [0, 0]
    assert [int(i) for i in _replicas(opt.iterations)] == [2, 2]


def test_tf_keras_own_wrapper_also_skips_on_every_replica(mirrored_strategy):
    """The reference: tf_keras sums the gradients before its check."""
    var, opt = _build(mirrored_strategy,
                      tf_keras.mixed_precision.LossScaleOptimizer)
    step = _train_step(mirrored_strategy, opt, var, documented=True)
    step(tf.constant(True))
    for replica in _replicas(var):
        np.testing.assert_array_equal(replica, [1.0, 2.0])
    assert float(opt.loss_scale) == 4.0


def test_fit_under_mirrored_strategy_with_mixed_float16(mirrored_strategy,
                                                        mixed_float16):
    with mirrored_strategy.scope():
        model = tf_keras.Sequential([
            tf_keras.layers.Dense(4, input_shape=(3,)),
            tf_keras.layers.Dense(1, dtype="float32")])
        opt = tf_lossscale.LossScaleOptimizer(
            tf_keras.optimizers.SGD(0.01), initial_scale=2.0**40)
        model.compile(optimizer=opt, loss="mse")
    assert model.optimizer is opt
    rng = np.random.default_rng(1)
    x = rng.normal(size=(32, 3)).astype("float32")
    y = rng.normal(size=(32, 1)).astype("float32")
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    # float16 gradients overflow at 2**40: early steps skip on both
    # replicas and halve the scale; the replicas stay equal.
    assert opt.iterations.numpy() == 4
    scales = [float(s) for s in _replicas(opt.dynamic_scale)]
    assert scales[0] == scales[1] < 2.0**40
    kernel = _replicas(model.layers[0].kernel)
    np.testing.assert_array_equal(kernel[0], kernel[1])
    assert np.isfinite(kernel[0]).all()


# Behaviours tf_keras' own test file checks on both optimizer families
# under MirroredStrategy, on ours and on tf_keras' wrapper side by side.

THEIRS = tf_keras.mixed_precision.LossScaleOptimizer
FAMILIES = {"current": tf_keras.optimizers, "legacy": tf_keras.optimizers.legacy}
MODES = ["eager", "function"]


def _run_in_replicas(strategy, mode, fn):
    """`fn(*args)` in every replica, eagerly or inside a tf.function; the
    replica function returns nothing (ours and tf_keras' return ops)."""
    def run(*args):
        strategy.run(lambda *a: fn(*a) and None, args=args)
    return tf.function(run) if mode == "function" else run


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_minimize_scales_the_loss_skips_and_counts_as_tf_keras(
        mirrored_strategy, family, mode):
    strategy, sgd = mirrored_strategy, FAMILIES[family].SGD
    replicas = strategy.num_replicas_in_sync
    traces = []
    for make in (tf_lossscale.LossScaleOptimizer, THEIRS):
        with strategy.scope():
            fixed_var = tf.Variable([5.0])
            fixed = make(sgd(2.0), dynamic=False, initial_scale=10.0)
            var = tf.Variable([1.0, 2.0])
            dynamic = make(sgd(1.0), initial_scale=2, dynamic_growth_steps=1)
        calls = []
        check = identity_checking_its_gradient(10.0 / replicas, calls)
        _run_in_replicas(
            strategy, mode, lambda opt=fixed, v=fixed_var, check=check:
            opt.minimize(lambda: check(v) / replicas, [v]))()
        assert calls  # The gradient reaching the loss was checked.
        trace = [(_replicas(fixed_var), float(fixed.loss_scale),
                  [int(i) for i in _replicas(fixed.iterations)])]
        step = _run_in_replicas(
            strategy, mode, lambda f, opt=dynamic, v=var: opt.minimize(
                lambda: v * f / replicas, [v]))
        for factor in (2.0, np.nan):
            step(tf.constant(factor))
            trace.append((_replicas(var), float(dynamic.loss_scale),
                          [int(i) for i in _replicas(dynamic.iterations)]))
        traces.append([[np.asarray(x).tolist() if isinstance(x, list) else x
                        for x in t] for t in trace])
    assert traces[0] == traces[1]
    # Unscaled gradient 1 (summed over the replicas) times the rate 2; then
    # the summed gradient 2: applied, scale doubled; then NaN: skipped.
    assert traces[0] == [
        [[[3.0], [3.0]], 10.0, [1, 1]],
        [[[-1.0, 0.0], [-1.0, 0.0]], 4.0, [1, 1]],
        [[[-1.0, 0.0], [-1.0, 0.0]], 2.0, [2, 2]]]


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_inner_apply_gradients_gets_plain_tensors_as_with_tf_keras(
        mirrored_strategy, family, mode):
    """An inner optimizer that overrides apply_gradients sees tensors, not
    PerReplica values, and is the one that applies the step."""
    seen = []
    if family == "legacy":
        class Recording(tf_keras.optimizers.legacy.SGD):
            def apply_gradients(self, grads_and_vars, name=None,
                                experimental_aggregate_gradients=True):
                grads_and_vars = list(grads_and_vars)
                seen.append([type(g) for g, _ in grads_and_vars])
                return super().apply_gradients(
                    grads_and_vars, name, experimental_aggregate_gradients)
    else:
        class Recording(tf_keras.optimizers.SGD):
            def apply_gradients(self, grads_and_vars, name=None,
                                skip_gradients_aggregation=False, **kwargs):
                grads_and_vars = list(grads_and_vars)
                seen.append([type(g) for g, _ in grads_and_vars])
                return super().apply_gradients(
                    grads_and_vars, name=name,
                    skip_gradients_aggregation=skip_gradients_aggregation,
                    **kwargs)

    results = []
    for make in (tf_lossscale.LossScaleOptimizer, THEIRS):
        seen.clear()
        with mirrored_strategy.scope():
            var = tf.Variable([5.0])
            opt = make(Recording(learning_rate=1.0), dynamic=False,
                       initial_scale=1)
        _run_in_replicas(mirrored_strategy, mode, lambda opt=opt, var=var:
                         opt.minimize(lambda: var * 2.0, [var]))()
        assert seen and all(
            issubclass(t, tf.Tensor) for types in seen for t in types), seen
        results.append((len(seen), _replicas(var)))
    assert results[0][0] == results[1][0]
    # The gradient 2 of each replica, summed: 5 - 1 * 4.
    assert [np.asarray(r).tolist() for r in results[0][1]] == [[1.0]] * 2
    assert [np.asarray(r).tolist() for r in results[1][1]] == [[1.0]] * 2


def _experimental(inner, loss_scale):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return tf_lossscale.experimental.LossScaleOptimizer(inner, loss_scale)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_experimental_class_under_mirrored_strategy(mirrored_strategy,
                                                        family):
    """TF 2.4's tests of its experimental optimizer, on tf_keras' families."""
    strategy, sgd = mirrored_strategy, FAMILIES[family].SGD
    replicas = strategy.num_replicas_in_sync

    def counters(opt):
        """The counter's value on each replica (one value if it is read as
        a tensor)."""
        return {int(c) for c in strategy.experimental_local_results(
            opt.dynamic_counter)}

    def checked_step(opt, var, expected):
        calls = []
        check = identity_checking_its_gradient(expected, calls)
        _run_in_replicas(strategy, "function", lambda: opt.minimize(
            lambda: check(var) / replicas, [var]))()
        assert calls

    # A number: a fixed scale.
    with strategy.scope():
        var = tf.Variable([5.0])
        opt = _experimental(sgd(2.0), 2)
    assert isinstance(opt.loss_scale, tf.Tensor)
    assert (float(opt.loss_scale), opt.initial_scale,
            opt.dynamic_growth_steps) == (2.0, 2.0, None)
    checked_step(opt, var, 2.0 / replicas)
    assert [v.numpy().tolist() for v in var.values] == [[3.0]] * 2

    # "dynamic": TensorFlow's defaults; a NaN step halves the scale.
    with strategy.scope():
        var = tf.Variable([5.0])
        opt = _experimental(sgd(2.0), "dynamic")
    assert (opt.initial_scale, opt.dynamic_growth_steps,
            float(opt.loss_scale)) == (2.0**15, 2000, 2.0**15)
    assert counters(opt) == {0}
    _run_in_replicas(strategy, "function", lambda: opt.minimize(
        lambda: var * np.nan, [var]))()
    assert [v.numpy().tolist() for v in var.values] == [[5.0]] * 2
    assert float(opt.loss_scale) == 2.0**14 and counters(opt) == {0}

    # A DynamicLossScale: its settings, not its current value.
    loss_scale = tf_lossscale.DynamicLossScale(
        initial_loss_scale=4, increment_period=1, multiplier=2)
    loss_scale._current_loss_scale.assign(2)
    with strategy.scope():
        var = tf.Variable([5.0])
        opt = _experimental(sgd(2.0), loss_scale)
    assert (opt.initial_scale, opt.dynamic_growth_steps,
            float(opt.loss_scale)) == (4.0, 1, 4.0)
    assert counters(opt) == {0}
    checked_step(opt, var, 4.0 / replicas)
    assert [v.numpy().tolist() for v in var.values] == [[3.0]] * 2
    assert float(opt.loss_scale) == 8.0
