"""The tf_keras flavour under MirroredStrategy over two logical CPUs.

Runs under TF_USE_LEGACY_KERAS=1 (see tests/test_tf_keras_optimizer.py);
tests/conftest.py makes the two CPUs and the one strategy of the process.
"""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

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


def test_apply_in_a_cross_replica_context_raises_and_changes_nothing(
        mirrored_strategy):
    var, opt = _build(mirrored_strategy)
    with mirrored_strategy.scope():
        with pytest.raises(ValueError, match="replica context"):
            opt.apply_gradients([(tf.constant([1.0, 1.0]), var)])
    assert opt.iterations.numpy() == 0 and opt.loss_scale.numpy() == 8.0


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
