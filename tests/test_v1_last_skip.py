"""`last_skip` of the TF1 `MixedPrecisionLossScaleOptimizer` (ours only:
TensorFlow's class has no such attribute), and its stop from a `tf.function`.

Eagerly and in `tf.function` it keeps the Keras flavours' record
(tests/test_skip_record.py); in a `tf.compat.v1.Session` graph it is None and
the graph holds exactly the variables TensorFlow's optimizer makes.
"""

from __future__ import annotations

import collections
from typing import List, Set

import numpy as np
import pytest
import tensorflow as tf

import tf_lossscale
from tf_lossscale import v1_skip_record

NAN, INF = np.nan, np.inf
v1 = tf.compat.v1


def _variables():
    return tf.Variable([1.0, 2.0], name="w"), tf.Variable([0.5], name="b")


def _optimizer(wrapper=tf_lossscale.MixedPrecisionLossScaleOptimizer,
               **kwargs):
    return wrapper(v1.train.GradientDescentOptimizer(0.5), "dynamic",
                   **kwargs)


def _run(wrapper, steps: List[List[float]]):
    w, b = _variables()
    opt = _optimizer(wrapper)
    for grad in steps:
        opt.apply_gradients([(tf.constant(grad), w), (tf.ones(1), b)])
    return opt, [w.numpy().tolist(), b.numpy().tolist()]


def test_eagerly_it_names_the_gradient_the_step_and_the_scale_used():
    steps = [[1.0, 1.0], [NAN, 1.0], [1.0, INF], [2.0, 2.0], [NAN, 1.0]]
    ours, values = _run(tf_lossscale.MixedPrecisionLossScaleOptimizer,
                        steps[:3])
    theirs, their_values = _run(
        v1.mixed_precision.MixedPrecisionLossScaleOptimizer, steps[:3])
    assert values == their_values == [[0.5, 1.5], [0.0]]
    assert not hasattr(theirs, "last_skip")
    record = ours.last_skip
    assert (record.step, record.streak, record.first_step) == (2, 2, 1)
    assert (record.names, record.kinds, record.count, record.total) == (
        ("w",), ("Inf",), 1, 2)
    assert record.scale == 2.0**14  # The scale the step used; now 2**13.
    assert float(ours.loss_scale()) == 2.0**13
    assert str(record) == ("step 2 skipped on replica 0: 1 of 2 gradients "
                           "non-finite (Inf): w; scale 2^14")
    fresh, _ = _run(tf_lossscale.MixedPrecisionLossScaleOptimizer, steps)
    # An applied step (3) ends a run: step 4 begins a new one.
    assert (fresh.last_skip.step, fresh.last_skip.streak,
            fresh.last_skip.first_step) == (4, 1, 4)
    assert _run(tf_lossscale.MixedPrecisionLossScaleOptimizer,
                steps[:1])[0].last_skip is None


def test_a_tf_function_loop_records_and_stops_at_max_consecutive_skips():
    w, b = _variables()
    opt = _optimizer(max_consecutive_skips=2)

    @tf.function
    def step(grad: tf.Tensor) -> None:
        opt.apply_gradients([(grad, w), (tf.ones(1), b)])

    step(tf.constant([1.0, 1.0]))
    step(tf.constant([1.0, INF]))
    assert str(opt.last_skip) == ("step 1 skipped on replica 0: 1 of 2 "
                                  "gradients non-finite (Inf): w; scale 2^15")
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"SkipStreakError: 2 steps in a row were "
                             r"skipped \(max_consecutive_skips=2\); the "
                             r"last, step 2, used scale 16384 and had "
                             r"non-finite gradients: w\]"):
        step(tf.constant([NAN, 1.0]))
    record = opt.last_skip
    assert (record.step, record.streak, record.first_step) == (2, 2, 1)
    assert record.kinds == ("NaN",)
    assert w.numpy().tolist() == [0.5, 1.5]


def test_the_eager_stop_carries_the_record():
    w, _ = _variables()
    opt = _optimizer(max_consecutive_skips=2)
    opt.apply_gradients([(tf.constant([NAN, 1.0]), w)])
    # The Keras flavours' message (tests/test_skip_record.py), once the
    # step has run: the record, the scale it used and the scale now.
    with pytest.raises(tf_lossscale.SkipStreakError,
                       match=r"^2 steps in a row were skipped "
                             r"\(max_consecutive_skips=2\), steps 0 to 1; "
                             r"the last: step 1 skipped on replica 0: 1 of 1 "
                             r"gradients non-finite \(NaN and Inf\): w; "
                             r"scale 2\^14; the scale is now 2\^13\.$") as e:
        opt.apply_gradients([(tf.constant([NAN, INF]), w)])
    # The gradient held a NaN and an Inf.
    assert (e.value.record.streak, e.value.record.kinds) == (
        2, ("NaN and Inf",))
    assert e.value.record == opt.last_skip


def _session_graph_variables(wrapper) -> Set[str]:
    """A Session loop with a skipped step; the graph's global variables."""
    with tf.Graph().as_default():
        w = v1.get_variable("w", initializer=[1.0, 2.0], use_resource=True)
        x = v1.placeholder(tf.float32, [2])
        opt = wrapper(v1.train.MomentumOptimizer(0.1, 0.9), "dynamic")
        train = opt.minimize(tf.reduce_sum(w * x))
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for row in ([1.0, 1.0], [NAN, 1.0]):
                sess.run(train, {x: row})
            assert sess.run(opt._loss_scale()) == 2.0**14
        assert getattr(opt, "last_skip", None) is None
        return {v.op.name for v in v1.global_variables()}


def test_in_a_session_graph_there_is_no_record_and_no_variable_of_ours():
    """A Saver saves every global variable: the graph must hold exactly
    TensorFlow's, so Saver checkpoints interchange (see v1_skip_record)."""
    ours = _session_graph_variables(
        tf_lossscale.MixedPrecisionLossScaleOptimizer)
    assert ours == _session_graph_variables(
        v1.mixed_precision.MixedPrecisionLossScaleOptimizer)
    assert not {n for n in ours if "skip" in n}


def _finite_path_ops(n: int, record: bool, monkeypatch) -> collections.Counter:
    """The op types of a traced step of `n` variables, skip branch aside."""
    from test_skip_record import ops_outside_the_skip_branch

    monkeypatch.setattr(v1_skip_record.V1SkipRecord, "available",
                        staticmethod(lambda: record))
    variables = [tf.Variable(np.ones(3, "float32")) for _ in range(n)]
    opt = _optimizer()
    step = tf.function(lambda grads: opt.apply_gradients(
        list(zip(grads, variables))) and None)
    return ops_outside_the_skip_branch(step, n)


def test_the_finite_path_gains_no_op_per_variable(monkeypatch):
    added = {n: _finite_path_ops(n, True, monkeypatch)
             - _finite_path_ops(n, False, monkeypatch) for n in (4, 8)}
    # The same few ops whatever the number of variables: the step counter's
    # add, the scale read for the record, and the record's variables
    # captured by the cond.
    assert added[4] == added[8], added
    # Seen on TF 2.21: 5 captured handles (the record's 4 and the step
    # counter), one read, one add, 2 NoOps, a Const (10 ops; 76 without the
    # record at 4 variables, 88 at 8).
    assert (added[4]["Placeholder"], added[4]["AssignAddVariableOp"]) == (
        5, 1), added[4]
    assert sum(added[4].values()) <= 10, added[4]
    assert not (_finite_path_ops(4, False, monkeypatch)
                - _finite_path_ops(4, True, monkeypatch))


def test_a_nan_on_replica_1_only_is_traced_to_replica_1(mirrored_strategy):
    with mirrored_strategy.scope():
        w, b = _variables()
        opt = _optimizer()

    def replica_step() -> None:
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        nan = tf.where(tf.equal(replica, 1), NAN, 1.0)
        opt.apply_gradients([(tf.ones(2), w), (tf.reshape(nan, [1]), b)])

    tf.function(lambda: mirrored_strategy.run(replica_step))()
    record = opt.last_skip
    assert (record.replica, record.replicas, record.names) == (1, 1, ("b",))
    assert str(record) == ("step 0 skipped on replica 1: 1 of 2 gradients "
                           "non-finite (NaN): b; scale 2^15")
    assert [v.numpy().tolist() for v in b.values] == [[0.5], [0.5]]
