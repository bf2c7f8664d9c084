"""An inner optimizer that is itself a wrapper, as Model Garden's EMA one.

Model Garden (2.20)'s `ExponentialMovingAverage` is a tf_keras legacy
`OptimizerV2` that wraps another optimizer and keeps a moving average of the
model's weights; its `apply_gradients(grads_and_vars, name=None)` takes no
`experimental_aggregate_gradients` and calls its inner optimizer's, which
sums the gradients across replicas. tf_keras' `LossScaleOptimizer` calls its
inner optimizer with `experimental_aggregate_gradients=False` and so fails
with a `TypeError`; ours gives such an inner optimizer each replica's own
gradients, without that keyword (summing them first would sum them twice),
and the replicas still agree on one verdict.

`MovingAverage` below is a stand-in of that shape written for this test:
each step it applies the gradients with its inner optimizer, then moves
each average halfway to its weight. Runs under TF_USE_LEGACY_KERAS=1.
"""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import tf_lossscale


class MovingAverage(tf_keras.optimizers.legacy.Optimizer):
    """Applies with `optimizer`, then averages the weights it was given
    (`average = decay * average + (1 - decay) * weight`)."""

    def __init__(self, optimizer, weights, decay=0.5, name="MovingAverage"):
        super().__init__(name)
        self._optimizer = optimizer
        self._decay = decay
        self._weights = list(weights)
        self.averages = [tf.Variable(w.read_value(), trainable=False)
                         for w in self._weights]

    @property
    def iterations(self):
        return self._optimizer.iterations

    @iterations.setter
    def iterations(self, variable):
        self._optimizer.iterations = variable

    def apply_gradients(self, grads_and_vars, name=None):
        applied = self._optimizer.apply_gradients(grads_and_vars, name)
        self._update_averages()
        return applied

    def _update_averages(self):
        decay = self._decay

        def move(average, weight):
            return average.assign(decay * average + (1.0 - decay) * weight)

        def update(strategy, pairs):
            for average, weight in pairs:
                strategy.extended.update(average, move, args=(weight,))

        tf.distribute.get_replica_context().merge_call(
            update, args=(list(zip(self.averages, self._weights)),))


def _build(strategy, scaled):
    with strategy.scope():
        var = tf.Variable([1.0, 2.0])
        opt = MovingAverage(tf_keras.optimizers.legacy.SGD(0.125), [var])
        if scaled:
            opt = tf_lossscale.LossScaleOptimizer(
                opt, initial_scale=2.0**15, dynamic_growth_steps=2)
    return var, opt


def _step(strategy, opt, var, scaled):
    """A traced step: replica r's loss is (r + 1) * sum(c * var); its
    gradients are NaN on replica 1 only if `poison`."""

    def replica_step(c, poison):
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        weight = tf.cast(replica + 1, tf.float32)
        with tf.GradientTape() as tape:
            loss = weight * tf.reduce_sum(c * var)
            if scaled:
                loss = opt.get_scaled_loss(loss)
        grads = tape.gradient(loss, [var])
        if scaled:
            grads = opt.get_unscaled_gradients(grads)
        bad = tf.logical_and(poison, tf.equal(replica, 1))
        grads = [tf.where(bad, g * np.nan, g) for g in grads]
        opt.apply_gradients(zip(grads, [var]))

    return tf.function(
        lambda c, poison: strategy.run(replica_step, args=(c, poison)))


def _state(var, opt):
    """Every replica's weights and averages, and the SGD's iterations."""
    ema = opt.inner_optimizer if hasattr(opt, "inner_optimizer") else opt
    values = [var] + ema.averages
    return ([v.numpy() for x in values for v in _local(x)],
            int(ema.iterations.numpy()))


def _local(variable):
    return getattr(variable, "values", (variable,))


COEFFICIENTS = ([1.0, 2.0], [0.5, -1.0], [3.0, 0.25])


def _train(strategy, scaled):
    var, opt = _build(strategy, scaled)
    step = _step(strategy, opt, var, scaled)
    states = []
    for c in COEFFICIENTS:
        step(tf.constant(c), tf.constant(False))
        states.append(_state(var, opt))
    return states, (var, opt, step)


def test_tf_keras_own_wrapper_fails_on_such_an_inner_optimizer():
    var = tf.Variable([1.0, 2.0])
    opt = tf_keras.mixed_precision.LossScaleOptimizer(
        MovingAverage(tf_keras.optimizers.legacy.SGD(0.125), [var]))
    with pytest.raises(TypeError, match="experimental_aggregate_gradients"):
        opt.apply_gradients([(tf.constant([1.0, 1.0]), var)])


def test_trains_as_the_inner_optimizer_without_loss_scaling_on_one_device():
    strategy = tf.distribute.get_strategy()
    plain, _ = _train(strategy, scaled=False)
    ours, (_, opt, _) = _train(strategy, scaled=True)
    assert _equal(ours, plain)
    # 1 - 0.125 * 1, 2 - 0.125 * 2, ... (one replica: weight 1).
    np.testing.assert_array_equal(ours[0][0][0], [0.875, 1.75])
    assert [iterations for _, iterations in ours] == [1, 2, 3]
    assert float(opt.loss_scale) == 2.0**16  # Grew after two good steps.


def test_trains_as_the_inner_optimizer_without_loss_scaling_on_two_replicas(
        mirrored_strategy):
    plain, _ = _train(mirrored_strategy, scaled=False)
    ours, _ = _train(mirrored_strategy, scaled=True)
    assert _equal(ours, plain)
    # Summed once over the replicas: 1 - 0.125 * (1 + 2) * 1, ...
    np.testing.assert_array_equal(ours[0][0][0], [0.625, 1.25])
    np.testing.assert_array_equal(ours[0][0][1], [0.625, 1.25])
    assert [iterations for _, iterations in ours] == [1, 2, 3]


def test_nan_on_one_replica_makes_both_replicas_skip(mirrored_strategy):
    _, (var, opt, step) = _train(mirrored_strategy, scaled=True)
    before, iterations = _state(var, opt)
    scale = float(opt.loss_scale)
    step(tf.constant([1.0, 1.0]), tf.constant(True))
    after, skipped = _state(var, opt)
    for old, new in zip(before, after):
        np.testing.assert_array_equal(new.view(np.uint8), old.view(np.uint8))
    assert skipped == iterations + 1
    assert float(opt.loss_scale) == scale / 2


def test_gradients_already_summed_over_replicas_are_refused(
        mirrored_strategy):
    var, opt = _build(mirrored_strategy, scaled=True)
    before = _state(var, opt)

    def replica_step():
        opt.apply_gradients([(tf.constant([1.0, 1.0]), var)],
                            experimental_aggregate_gradients=False)

    with pytest.raises(TypeError, match=(
            "experimental_aggregate_gradients=False under 2 replicas, but "
            "the inner optimizer .*MovingAverage takes no")):
        mirrored_strategy.run(replica_step)
    after = _state(var, opt)
    assert _equal([after], [before])


def test_gradients_not_summed_on_one_device_are_applied():
    var, opt = _build(tf.distribute.get_strategy(), scaled=True)
    opt.apply_gradients([(tf.constant([8.0, 16.0]), var)],
                        experimental_aggregate_gradients=False)
    # Taken as unscaled (tf_keras' rule for unmarked gradients).
    np.testing.assert_array_equal(var.numpy(), [0.0, 0.0])
    np.testing.assert_array_equal(opt.inner_optimizer.averages[0].numpy(),
                                  [0.5, 1.0])


def _equal(ours, plain):
    """Same weights and averages, bit for bit, and the same iterations."""
    assert len(ours) == len(plain)
    for (values, iterations), (expected, expected_iterations) in zip(
            ours, plain):
        assert iterations == expected_iterations
        assert len(values) == len(expected)
        for value, other in zip(values, expected):
            np.testing.assert_array_equal(value.view(np.uint8),
                                          other.view(np.uint8))
    return True
