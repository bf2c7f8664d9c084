"""`DynamicLossScale.update` under `tf.distribute` strategies.

The verdict is reduced across replicas: a NaN on one replica only makes
every replica skip and back off. `update` belongs in a cross-replica
context; inside `strategy.run` it raises and changes nothing.
"""

import numpy as np
import pytest
import tensorflow as tf

from tf_lossscale import DynamicLossScale

NAN = float("nan")
# Our message; TensorFlow's own ("Method requires being in cross-replica
# context") would not match.
CROSS_REPLICA_ADVICE = "call it in a cross-replica context"


def _per_replica_grads(strategy, bad_replica=None):
    """One gradient per replica: [1, 2], or [1, NaN] on `bad_replica`."""

    def value(ctx):
        if ctx.replica_id_in_sync_group == bad_replica:
            return tf.constant([1.0, NAN])
        return tf.constant([1.0, 2.0])

    return strategy.experimental_distribute_values_from_function(value)


def _state_on_every_replica(strategy, loss_scale):
    """`(scale, good_steps)` as each replica reads its own copy."""
    per_replica = strategy.run(lambda: (loss_scale(), loss_scale.good_steps))
    scales, steps = (strategy.experimental_local_results(t)
                     for t in per_replica)
    return [(float(s), int(c)) for s, c in zip(scales, steps)]


def test_two_replicas_are_real(mirrored_strategy):
    assert mirrored_strategy.num_replicas_in_sync == 2
    grads = _per_replica_grads(mirrored_strategy, bad_replica=1)
    local = mirrored_strategy.experimental_local_results(grads)
    assert [np.isnan(t.numpy()).any() for t in local] == [False, True]


@pytest.mark.parametrize("bad_replica", [0, 1])
def test_nan_on_one_replica_skips_and_backs_off_everywhere(
        mirrored_strategy, bad_replica):
    with mirrored_strategy.scope():
        loss_scale = DynamicLossScale(8, 2)
        grads = _per_replica_grads(mirrored_strategy, bad_replica)
        update_op, should_apply = loss_scale.update([grads, None])
    assert update_op is None
    assert not bool(should_apply)
    assert _state_on_every_replica(mirrored_strategy, loss_scale) == [
        (4.0, 0), (4.0, 0)]


def test_finite_on_every_replica_applies_and_counts_everywhere(
        mirrored_strategy):
    with mirrored_strategy.scope():
        loss_scale = DynamicLossScale(8, 2)
        grads = _per_replica_grads(mirrored_strategy)
        verdicts = [bool(loss_scale.update([grads])[1]) for _ in range(3)]
    assert verdicts == [True, True, True]
    assert _state_on_every_replica(mirrored_strategy, loss_scale) == [
        (16.0, 1), (16.0, 1)]


def test_distributed_update_inside_tf_function(mirrored_strategy):
    with mirrored_strategy.scope():
        loss_scale = DynamicLossScale(8, 1)
        update = tf.function(lambda g: loss_scale.update([g])[1])
        bad = _per_replica_grads(mirrored_strategy, bad_replica=1)
        good = _per_replica_grads(mirrored_strategy)
        verdicts = [bool(update(g)) for g in (bad, good, bad, bad)]
    assert verdicts == [False, True, False, False]
    assert _state_on_every_replica(mirrored_strategy, loss_scale) == [
        (2.0, 0), (2.0, 0)]


def test_update_in_replica_context_raises_and_changes_nothing(
        mirrored_strategy):
    with mirrored_strategy.scope():
        loss_scale = DynamicLossScale(8, 2)
    with pytest.raises(RuntimeError, match=CROSS_REPLICA_ADVICE):
        mirrored_strategy.run(
            lambda: loss_scale.update([tf.constant([NAN])]))
    assert _state_on_every_replica(mirrored_strategy, loss_scale) == [
        (8.0, 0), (8.0, 0)]


def test_update_from_merge_call_is_cross_replica(mirrored_strategy):
    with mirrored_strategy.scope():
        loss_scale = DynamicLossScale(8, 2)

    def replica_step():
        grad = tf.constant([NAN]) if tf.distribute.get_replica_context(
        ).replica_id_in_sync_group == 0 else tf.constant([1.0])
        return tf.distribute.get_replica_context().merge_call(
            lambda strategy, g: loss_scale.update([g])[1], args=(grad,))

    verdicts = mirrored_strategy.experimental_local_results(
        mirrored_strategy.run(replica_step))
    assert {bool(v) for v in verdicts} == {False}
    assert float(loss_scale()) == 4.0


def test_default_strategy_updates_without_a_reduction():
    strategy = tf.distribute.get_strategy()
    with strategy.scope():
        loss_scale = DynamicLossScale(8, 2)
        assert not bool(loss_scale.update([tf.constant([NAN])])[1])
        assert bool(loss_scale.update([tf.constant([1.0])])[1])
    assert (float(loss_scale()), int(loss_scale.good_steps)) == (4.0, 1)


def test_one_device_strategy_updates_in_cross_replica_context():
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        loss_scale = DynamicLossScale(8, 2)
        assert not bool(loss_scale.update([tf.constant([NAN])])[1])
        assert bool(loss_scale.update([tf.constant([1.0])])[1])
        with pytest.raises(RuntimeError, match=CROSS_REPLICA_ADVICE):
            strategy.run(lambda: loss_scale.update([tf.constant([NAN])]))
    assert (float(loss_scale()), int(loss_scale.good_steps)) == (4.0, 1)


def test_per_replica_grads_outside_the_scope_get_a_clear_error(
        mirrored_strategy):
    with mirrored_strategy.scope():
        loss_scale = DynamicLossScale(8, 2)
    grads = _per_replica_grads(mirrored_strategy, bad_replica=1)
    with pytest.raises((RuntimeError, ValueError), match=r"scope\(\)"):
        loss_scale.update([grads])
    assert float(loss_scale()) == 8.0
