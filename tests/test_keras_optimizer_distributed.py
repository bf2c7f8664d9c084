"""The Keras 3 LossScaleOptimizer under MirroredStrategy (two logical CPUs).

The steps run as `fit` runs them: `strategy.run` of a train step that
scales the loss and calls `apply_gradients`, inside a `tf.function`. The
tests that hold on both Kerases are written once, in _both_distributed.py,
and run here on Keras 3 (imported below) and in
tf_keras_cases/cases_distributed.py on tf_keras.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from _both_distributed import *  # noqa: F403 (the tests on both Kerases)

import tf_lossscale


def _build(strategy, kind):
    with strategy.scope():
        var = keras.Variable([1.0, 2.0])
        inner = keras.optimizers.SGD(0.1, momentum=0.9)
        if kind == "ours":
            opt = tf_lossscale.LossScaleOptimizer(
                inner, initial_scale=8.0, dynamic_growth_steps=2)
        else:
            opt = keras.mixed_precision.LossScaleOptimizer(
                inner, initial_scale=8.0, dynamic_growth_steps=2)
        opt.build([var])
    return var, opt


def _train_step(strategy, opt, var, documented=False):
    """A step whose gradients are NaN on replica 1 only when `poison`."""

    def replica_step(poison):
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(var * var)
            if documented:
                loss = opt.get_scaled_loss(loss)
            else:
                loss = opt.scale_loss(loss)
        grads = tape.gradient(loss, [var])
        if documented:
            grads = opt.get_unscaled_gradients(grads)
        bad = tf.logical_and(poison, tf.equal(replica, 1))
        grads = [tf.where(bad, g * np.nan, g) for g in grads]
        opt.apply_gradients(zip(grads, [var]))

    return lambda poison: strategy.run(replica_step, args=(poison,))


def _replica_values(variable):
    return [v.numpy() for v in variable.value.values]


def _momentum(opt):
    (slot,) = [v for v in opt.inner_optimizer.variables
               if v.path.endswith("momentum")]
    return _replica_values(slot)


def test_nan_on_one_replica_skips_every_replica_where_keras_lets_it_in(
        mirrored_strategy):
    ours_var, ours = _build(mirrored_strategy, "ours")
    keras_var, theirs = _build(mirrored_strategy, "keras")
    ours_step = tf.function(_train_step(mirrored_strategy, ours, ours_var))
    keras_step = tf.function(
        _train_step(mirrored_strategy, theirs, keras_var))
    ours_step(tf.constant(False))
    keras_step(tf.constant(False))
    before = _replica_values(ours_var), _momentum(ours)
    # Both replicas: 2*v summed over 2 replicas, lr 0.1 -> v * 0.6.
    np.testing.assert_allclose(before[0], [[0.6, 1.2]] * 2, rtol=1e-6)
    np.testing.assert_array_equal(_replica_values(keras_var), before[0])

    ours_step(tf.constant(True))
    keras_step(tf.constant(True))

    # Ours: every replica skipped; weights and momentum bit-identical.
    np.testing.assert_array_equal(_replica_values(ours_var), before[0])
    np.testing.assert_array_equal(_momentum(ours), before[1])
    assert float(ours.loss_scale) == 4.0
    assert _replica_values(ours.dynamic_scale) == [4.0, 4.0]
    assert _replica_values(ours.step_counter) == [0, 0]
    assert int(ours.iterations.numpy()) == 2
    # Keras 3.15's own optimizer trusts replica 0's verdict: the NaN of
    # replica 1 reaches the weights through the gradient all-reduce, and
    # the scale even grew on that step. If Keras is fixed, this fails.
    assert np.isnan(_replica_values(keras_var)).all()
    assert float(theirs.dynamic_scale.numpy()) == 16.0


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("documented", [False, True],
                         ids=["scale_loss", "get_unscaled_gradients"])
def test_both_flows_apply_once_unscaled_and_skip_together(
        mirrored_strategy, mode, documented):
    var, opt = _build(mirrored_strategy, "ours")
    step = _train_step(mirrored_strategy, opt, var, documented)
    if mode == "function":
        step = tf.function(step)
    step(tf.constant(False))
    np.testing.assert_allclose(_replica_values(var), [[0.6, 1.2]] * 2,
                               rtol=1e-6)
    step(tf.constant(True))
    np.testing.assert_allclose(_replica_values(var), [[0.6, 1.2]] * 2,
                               rtol=1e-6)
    step(tf.constant(False))
    # momentum: 0.9 * -0.4 - 0.1 * 2.4 = -0.6 per unit of [1, 2].
    np.testing.assert_allclose(_replica_values(var), [[0.0, 0.0]] * 2,
                               atol=1e-6)
    assert (float(opt.loss_scale), int(opt.iterations.numpy())) == (4.0, 3)


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_documented_flow_with_a_collective_between_unscale_and_apply(
        mirrored_strategy, mode):
    """Each replica's thread keeps its own "already unscaled" mark.

    The all-reduce between `get_unscaled_gradients` and `apply_gradients`
    (a global-norm clip, as is common) lets the other replica run its
    `get_unscaled_gradients` before this one applies.
    """
    var, opt = _build(mirrored_strategy, "ours")

    def replica_step():
        ctx = tf.distribute.get_replica_context()
        with tf.GradientTape() as tape:
            loss = opt.get_scaled_loss(tf.reduce_sum(var * var))
        grads = opt.get_unscaled_gradients(tape.gradient(loss, [var]))
        squares = ctx.all_reduce(tf.distribute.ReduceOp.SUM,
                                 tf.reduce_sum(grads[0] ** 2))
        grads, _ = tf.clip_by_global_norm(grads, 100.0,
                                          use_norm=tf.sqrt(squares))
        opt.apply_gradients(zip(grads, [var]))

    step = lambda: mirrored_strategy.run(replica_step)  # noqa: E731
    if mode == "function":
        step = tf.function(step)
    step()
    np.testing.assert_allclose(_replica_values(var), [[0.6, 1.2]] * 2,
                               rtol=1e-6)


def test_fit_under_mirrored_strategy_trains_with_mixed_float16(
        mirrored_strategy):
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        with mirrored_strategy.scope():
            model = keras.Sequential([
                keras.Input((3,)),
                keras.layers.Dense(  # float16: overflows at 2**30.
                    4, kernel_initializer=keras.initializers.GlorotUniform(
                        seed=3)),
                keras.layers.Dense(1, dtype="float32",
                                   kernel_initializer="zeros"),
            ])
            opt = tf_lossscale.LossScaleOptimizer(
                keras.optimizers.SGD(0.1), initial_scale=2.0**30)
            model.compile(optimizer=opt, loss="mse")
        x = np.random.default_rng(0).normal(size=(64, 3)).astype("float32")
        y = x @ np.array([[1.0], [-2.0], [0.5]], "float32")
        history = model.fit(x, y, batch_size=16, epochs=3, verbose=0)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert model.optimizer is opt
    assert int(opt.iterations.numpy()) == 12
    assert float(opt.loss_scale) < 2.0**30  # Backed off from overflow.
    losses = history.history["loss"]
    assert losses[-1] < losses[0]


def test_none_and_sparse_gradients_cross_the_replicas(mirrored_strategy):
    with mirrored_strategy.scope():
        dense, unused = keras.Variable([1.0, 2.0]), keras.Variable([1.0])
        table = keras.Variable(np.ones((3, 2), "float32"))
        opt = tf_lossscale.LossScaleOptimizer(
            keras.optimizers.SGD(0.1), initial_scale=4.0)
        opt.build([dense, unused, table])

    def replica_step(poison):
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        value = tf.where(tf.logical_and(poison, tf.equal(replica, 1)),
                         np.nan, 4.0)
        rows = tf.IndexedSlices(value * tf.ones((1, 2)), tf.constant([1]),
                                tf.constant([3, 2]))
        opt.apply_gradients([(tf.constant([4.0, 4.0]), dense),
                             (None, unused), (rows, table)])

    step = tf.function(
        lambda poison: mirrored_strategy.run(replica_step, args=(poison,)))
    with pytest.warns(UserWarning, match="Gradients do not exist"):
        step(tf.constant(False))
    expected_table = [[1.0, 1.0], [0.8, 0.8], [1.0, 1.0]]
    np.testing.assert_allclose(_replica_values(dense), [[0.8, 1.8]] * 2)
    np.testing.assert_allclose(_replica_values(table), [expected_table] * 2)
    step(tf.constant(True))  # NaN in replica 1's sparse rows only.
    np.testing.assert_allclose(_replica_values(dense), [[0.8, 1.8]] * 2)
    np.testing.assert_allclose(_replica_values(table), [expected_table] * 2)
    np.testing.assert_array_equal(_replica_values(unused), [[1.0]] * 2)
    assert float(opt.loss_scale) == 2.0


def test_gradients_summed_by_the_caller_are_not_summed_again(
        mirrored_strategy):
    """TF 2.4-2.15's apply_gradients(..., experimental_aggregate_gradients=
    False), as tensorflow/models' grad_utils calls it after its own
    all-reduce: each replica's update uses the sum once."""
    with mirrored_strategy.scope():
        var = tf.Variable([1.0, 2.0])
        opt = tf_lossscale.LossScaleOptimizer(
            keras.optimizers.SGD(0.25), initial_scale=4.0)

    @tf.function
    def step():
        def replica():
            ctx = tf.distribute.get_replica_context()
            grad = tf.constant([4.0, 8.0])  # scaled by 4: [1, 2] unscaled
            summed = ctx.all_reduce(tf.distribute.ReduceOp.SUM, grad)
            with tf.GradientTape():
                opt.get_scaled_loss(tf.constant(0.0))
            opt.apply_gradients([(summed, var)],
                                experimental_aggregate_gradients=False)
        mirrored_strategy.run(replica)

    step()
    # One sum of two replicas' [1, 2]: [2, 4]; SGD(0.25) moves by [0.5, 1].
    for replica in mirrored_strategy.experimental_local_results(var):
        np.testing.assert_array_equal(replica.numpy(), [0.5, 1.0])


def test_loss_scale_keyword_gets_a_helpful_error():
    with pytest.raises(ValueError, match="experimental.LossScaleOptimizer"):
        tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(),
                                        loss_scale="dynamic")
