"""distribute.py: the replica guards, and how the apply-or-skip branch runs."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_lossscale
from tf_lossscale import distribute


def _if_ops(concrete):
    ops = [op for op in concrete.graph.get_operations()
           if op.type in ("If", "StatelessIf")]
    return [op.get_attr("_lower_using_switch_merge") for op in ops]


def test_the_branch_runs_as_one_call_without_a_strategy():
    var = keras.Variable([1.0, 2.0])
    opt = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.Adam(0.1), initial_scale=4.0)
    opt.build([var])
    step = tf.function(lambda g: opt.apply_gradients([(g, var)]))
    concrete = step.get_concrete_function(tf.TensorSpec([2], tf.float32))
    # The apply-or-skip If is not lowered into Switch/Merge nodes.
    assert False in _if_ops(concrete)
    before = var.numpy().copy()
    step(tf.constant([np.nan, 1.0]))
    np.testing.assert_array_equal(var.numpy(), before)
    step(tf.constant([4.0, 4.0]))
    assert not np.array_equal(var.numpy(), before)
    assert (int(opt.iterations), int(opt.skipped_steps)) == (2, 1)


def test_the_branch_stays_lowered_across_replicas(mirrored_strategy):
    with mirrored_strategy.scope():
        var = tf.Variable([1.0, 2.0])
        opt = tf_lossscale.LossScaleOptimizer(
            keras.optimizers.SGD(0.1), initial_scale=4.0)
        opt.build([var])

    @tf.function
    def step(g):
        mirrored_strategy.run(lambda: opt.apply_gradients([(g, var)]))

    concrete = step.get_concrete_function(tf.TensorSpec([2], tf.float32))
    assert False not in _if_ops(concrete)


def test_replica_context_error_is_both_originals_types():
    assert issubclass(distribute.ReplicaContextError, RuntimeError)
    assert issubclass(distribute.ReplicaContextError, ValueError)


def test_update_in_a_replica_context_raises(mirrored_strategy):
    loss_scale = tf_lossscale.DynamicLossScale(4.0)
    with pytest.raises(RuntimeError, match="cross-replica context"):
        mirrored_strategy.run(
            lambda: loss_scale.update([tf.constant([1.0])]))


def test_central_storage_strategy_is_refused_naming_it():
    strategy = tf.distribute.experimental.CentralStorageStrategy()
    with strategy.scope():
        with pytest.raises(ValueError, match="CentralStorageStrategy"):
            tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD())
