"""Checkpoints of `DynamicLossScale`, and its variables per TF1 graph.

TensorFlow's own `tf.compat.v1.mixed_precision.DynamicLossScale` and ours
write the same keys, so a `tf.train.Checkpoint` written by either restores
into the other with every value consumed.
"""

import numpy as np
import pytest
import tensorflow as tf

from tf_lossscale import DynamicLossScale

NAN = float("nan")
TheirDynamicLossScale = tf.compat.v1.mixed_precision.DynamicLossScale


def _step(loss_scale, *flags):
    for flag in flags:
        loss_scale.update([tf.constant([1.0 if flag else NAN])])


def _saved_values(path):
    """`{variable name: value}` of the loss-scale entries of a checkpoint."""
    reader = tf.train.load_checkpoint(path)
    return {name.split("/")[1]: reader.get_tensor(name)
            for name, _ in tf.train.list_variables(path)
            if name.startswith("ls/")}


def _write(loss_scale, path):
    return tf.train.Checkpoint(ls=loss_scale).write(str(path))


def test_ours_and_tensorflows_write_the_same_keys(tmp_path):
    ours = _write(DynamicLossScale(4, 3), tmp_path / "ours")
    theirs = _write(TheirDynamicLossScale(4, 3), tmp_path / "theirs")
    assert tf.train.list_variables(ours) == tf.train.list_variables(theirs)
    assert _saved_values(ours) == {"current_loss_scale": 4.0, "good_steps": 0}


def test_our_checkpoint_restores_into_tensorflows_class(tmp_path):
    ours = DynamicLossScale(4, 3)
    _step(ours, True, True, True, True)  # (8, 1)
    path = _write(ours, tmp_path / "ours")
    theirs = TheirDynamicLossScale(1000, 3)
    tf.train.Checkpoint(ls=theirs).read(path).assert_consumed()
    assert _saved_values(_write(theirs, tmp_path / "again")) == {
        "current_loss_scale": 8.0, "good_steps": 1}
    _step(theirs, True)
    assert float(theirs()) == 8.0
    _step(theirs, True)  # The restored count reaches the period here.
    assert float(theirs()) == 16.0


def test_tensorflows_checkpoint_restores_into_ours(tmp_path):
    theirs = TheirDynamicLossScale(4, 3)
    _step(theirs, False, True, True)  # (2, 2)
    path = _write(theirs, tmp_path / "theirs")
    ours = DynamicLossScale(1000, 3)
    tf.train.Checkpoint(ls=ours).read(path).assert_consumed()
    assert (float(ours()), int(ours.good_steps)) == (2.0, 2)
    _step(ours, True)
    assert (float(ours()), int(ours.good_steps)) == (4.0, 0)


def test_restore_keeps_float32_scale_bit_exact(tmp_path):
    theirs = TheirDynamicLossScale(3.0, 1, 1.1)
    _step(theirs, True, True, True)
    ours = DynamicLossScale(2.0, 1, 1.1)
    tf.train.Checkpoint(ls=ours).read(
        _write(theirs, tmp_path / "theirs")).assert_consumed()
    expected = np.float32(3.0) * np.float32(1.1) ** 3
    assert float(ours()) == float(theirs()) != 3.0 * 1.1**3
    assert float(ours()) == pytest.approx(float(expected), rel=1e-6)


def test_checkpoint_save_and_restore_round_trip(tmp_path):
    ours = DynamicLossScale(16, 2)
    _step(ours, False, True)  # (8, 1)
    checkpoint = tf.train.Checkpoint(ls=ours)
    path = checkpoint.save(str(tmp_path / "ckpt"))
    _step(ours, False, False)  # (2, 0)
    checkpoint.restore(path).assert_consumed()
    assert (float(ours()), int(ours.good_steps)) == (8.0, 1)


# TF1 graphs.


def _graph_update(loss_scale, flags):
    """Runs one update per flag in a new graph; returns its final state."""
    with tf.compat.v1.Graph().as_default(), tf.compat.v1.Session() as sess:
        grads = tf.compat.v1.placeholder(tf.float32, [1])
        update_op, _ = loss_scale.update([grads])
        sess.run(tf.compat.v1.global_variables_initializer())
        for flag in flags:
            sess.run(update_op, {grads: [1.0 if flag else NAN]})
        return sess.run([loss_scale(), loss_scale.good_steps])


def test_one_loss_scale_keeps_separate_variables_per_graph():
    loss_scale = DynamicLossScale(8, 2)
    assert _graph_update(loss_scale, [False, False]) == [2.0, 0]
    assert _graph_update(loss_scale, [True]) == [8.0, 1]
    # The eager variables saw neither graph's updates.
    assert (float(loss_scale()), int(loss_scale.good_steps)) == (8.0, 0)


def test_graph_checkpoint_holds_that_graphs_variables(tmp_path):
    loss_scale = DynamicLossScale(8, 2)
    _step(loss_scale, True)  # The eager pair: (8, 1).
    with tf.compat.v1.Graph().as_default(), tf.compat.v1.Session() as sess:
        update_op, _ = loss_scale.update([tf.constant([NAN])])
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(update_op)
        path = tf.compat.v1.train.Checkpoint(ls=loss_scale).save(
            str(tmp_path / "graph"), session=sess)
    assert _saved_values(path) == {"current_loss_scale": 4.0, "good_steps": 0}


def test_graph_restore_waits_for_the_graphs_variables(tmp_path):
    theirs = TheirDynamicLossScale(4, 3)
    _step(theirs, True, True)  # (4, 2)
    path = tf.train.Checkpoint(ls=theirs).save(str(tmp_path / "theirs"))
    loss_scale = DynamicLossScale(1000, 3)
    with tf.compat.v1.Graph().as_default(), tf.compat.v1.Session() as sess:
        # No variable of this graph exists yet: the restore is deferred
        # until update() creates them.
        status = tf.compat.v1.train.Checkpoint(ls=loss_scale).restore(path)
        update_op, _ = loss_scale.update([tf.constant([1.0])])
        status.assert_consumed().run_restore_ops(sess)
        assert sess.run([loss_scale(), loss_scale.good_steps]) == [4.0, 2]
        sess.run(update_op)
        assert sess.run([loss_scale(), loss_scale.good_steps]) == [8.0, 0]
