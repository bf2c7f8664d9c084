"""Why a step was skipped (`last_skip`, the monitor's lines) and the stop.

Real Keras 3 runs: a 20-layer float16 model with an overflow planted in one
known layer's gradient and a NaN in another's (`_planted_faults`); custom
loops eagerly and in `tf.function`; the traced finite path's op count with
and without the record. The tests that hold on both Kerases (the planted
faults in `fit`, the saved telemetry) are written once, in
`tests/_both_skip_record.py`, and run here on Keras 3 (imported below) and
in `tf_keras_cases/cases_monitor.py` on tf_keras.
"""

from __future__ import annotations

import collections
from typing import Any, Dict, Set

import keras
import numpy as np
import pytest
import tensorflow as tf
from _both_skip_record import *  # noqa: F403 (the tests on both Kerases)

import tf_lossscale

INF, NAN = np.inf, np.nan


def _two_variables():
    a = keras.Variable(np.ones(3, "float32"), name="a")
    b = keras.Variable(np.ones(2, "float32"), name="b")
    return a, b


def test_last_skip_is_none_until_a_step_is_skipped_then_says_which():
    a, b = _two_variables()
    opt = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    opt.build([a, b])
    assert opt.last_skip is None
    opt.apply([tf.constant([1.0, INF, 1.0]), tf.constant([NAN, 1.0])],
              [a, b])
    record = opt.last_skip
    assert isinstance(record, tf_lossscale.SkipRecord)
    assert str(record) == ("step 0 skipped on replica 0: 2 of 2 gradients "
                           "non-finite (NaN and Inf), in variable order: a, "
                           "b; scale 2^15")
    # Eagerly there is no backpropagation order, nor a loss seen.
    assert (record.order, record.source, record.loss) == (
        "variable", None, None)
    assert record.kinds == ("Inf", "NaN") and record.streak == 1
    assert record.first_step == 0
    np.testing.assert_array_equal(a.numpy(), np.ones(3))  # Skipped.


def test_a_tf_function_loop_reads_it_after_each_step():
    a, b = _two_variables()
    opt = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    opt.build([a, b])
    step = tf.function(lambda g1, g2: opt.apply([g1, g2], [a, b]))
    ones3, ones2 = tf.ones(3), tf.ones(2)
    step(ones3, tf.constant([1.0, INF]))
    step(ones3, tf.constant([1.0, INF]))
    assert (opt.last_skip.step, opt.last_skip.streak) == (1, 2)
    assert opt.last_skip.names == ("b",) and opt.last_skip.scale == 2.0**14
    step(ones3, ones2)
    assert opt.last_skip.step == 1  # A finite step leaves the record.
    step(tf.constant([NAN, 1.0, 1.0]), ones2)
    record = opt.last_skip
    assert (record.step, record.streak, record.first_step) == (3, 1, 3)
    assert record.names == ("a",) and record.kinds == ("NaN",)


def test_it_names_the_first_eight_in_variable_order():
    variables = [keras.Variable(np.ones(2, "float32"), name=f"v{i}")
                 for i in range(12)]
    opt = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    opt.build(variables)
    grads = [tf.constant([1.0, INF if i % 3 else NAN]) for i in range(12)]
    grads[0] = tf.ones(2)
    tf.function(lambda g: opt.apply(g, variables))(grads)
    record = opt.last_skip
    assert record.count == 11 and record.total == 12
    assert record.names == tuple(f"v{i}" for i in range(1, 9))
    assert record.kinds == tuple("NaN" if i % 3 == 0 else "Inf"
                                 for i in range(1, 9))
    # The step's inputs, not a tape's gradients: no backpropagation order.
    assert str(record).endswith(
        "(NaN and Inf), in variable order: v1, v2, v3, v4, v5, v6, v7, v8, "
        "...; scale 2^15")
    assert (record.order, record.farthest) == ("variable", "v11")


def test_max_consecutive_skips_stops_an_eager_loop_with_our_exception():
    a, b = _two_variables()
    opt = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(0.1), max_consecutive_skips=3)
    opt.build([a, b])
    bad = [tf.ones(3), tf.constant([1.0, INF])]
    opt.apply(bad, [a, b])
    opt.apply([tf.ones(3), tf.ones(2)], [a, b])  # The run restarts.
    opt.apply(bad, [a, b])
    opt.apply(bad, [a, b])
    with pytest.raises(tf_lossscale.SkipStreakError) as caught:
        opt.apply(bad, [a, b])
    message = str(caught.value)
    assert "3 steps in a row were skipped (max_consecutive_skips=3)" in message
    assert "steps 2 to 4" in message and ": b; scale 2^12" in message
    assert "the scale is now 2^11" in message
    assert caught.value.record.step == 4
    assert isinstance(caught.value, tf.errors.InvalidArgumentError)
    assert opt.get_config()["max_consecutive_skips"] == 3
    assert "max_consecutive_skips" not in tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(0.1)).get_config()


def test_max_consecutive_skips_stops_a_tf_function_loop():
    a, b = _two_variables()
    opt = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(0.1), dynamic=False, initial_scale=1,
        max_consecutive_skips=2)
    opt.build([a, b])
    step = tf.function(lambda g: opt.apply([tf.ones(3), g], [a, b]))
    step(tf.constant([NAN, 1.0]))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"SkipStreakError: 2 steps in a row were "
                             r"skipped \(max_consecutive_skips=2\); the last, "
                             r"step 1, used scale 1 and had non-finite "
                             r"gradients: b"):
        step(tf.constant([NAN, 1.0]))
    # From the host, the same check raises our type.
    with pytest.raises(tf_lossscale.SkipStreakError, match="steps 0 to 1"):
        opt.raise_if_stuck()


def _record(**fields: Any) -> tf_lossscale.SkipRecord:
    """A conv net's record at a finite loss: c3's gradients hold NaN only."""
    base = dict(step=0, scale=2.0**30, count=4, total=6,
                names=("c3/kernel", "c3/bias", "c2/kernel", "c2/bias"),
                kinds=("NaN",) * 4, replica=0, replicas=1, streak=1,
                first_step=0, order="backprop", farthest="c2/bias",
                loss="finite")
    base.update(fields)
    return tf_lossscale.SkipRecord(**base)


@pytest.mark.parametrize("fields, undecided, cause", [
    ({}, True, "NaN entered at c3 in the backward pass (the loss was "
               "finite; float16 overflow can leave NaN here)"),
    ({"loss": None}, True,
     "NaN entered at c3 (float16 overflow can leave NaN here)"),
    ({"entered": "Inf"}, False,
     "Inf entered at c3 in the backward pass (the loss was finite)"),
    ({"entered": "NaN"}, False,
     "NaN entered at c3 in the backward pass (the loss was finite)"),
    ({"kinds": ("NaN and Inf",) + ("NaN",) * 3}, False,
     "Inf entered at c3 in the backward pass (the loss was finite)"),
    ({"loss": "NaN"}, False, "the loss was NaN: the forward pass made it"),
    ({"order": "variable"}, False, "4 of 6 gradients non-finite (NaN), in "
                                   "variable order"),
])
def test_only_a_nan_the_gradients_cannot_place_is_undecided(fields,
                                                           undecided, cause):
    """NaN only at the source after a finite (or unseen) loss is what both
    overflow in a convolution and a real NaN leave: the line says so, and
    `at_floor` (no scale cured it) decides it is a real NaN."""
    record = _record(**fields)
    assert record.undecided is undecided
    assert record.summary().startswith(cause), record.summary()
    floored = record.at_floor()
    assert floored.undecided is False
    assert floored.entered == ("NaN" if undecided else record.entered)
    assert "overflow can leave" not in floored.summary()


def test_a_streak_stopped_at_min_scale_calls_its_nan_real():
    """A real backward NaN (the norm of a zero vector: 0 / 0) after a
    finite loss: each skipped step's line leaves it undecided, and the
    error raised at min_scale says NaN entered, without the remark."""
    w = keras.Variable(np.ones(2, "float32"), name="w")
    opt = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(0.1), initial_scale=2, min_scale=1,
        max_consecutive_skips=3)
    opt.build([w])

    @tf.function
    def step() -> None:
        with tf.GradientTape() as tape:
            loss = tf.norm(w - 1.0)
            scaled = opt.scale_loss(loss)
        opt.apply(tape.gradient(scaled, [w]), [w])

    step()
    assert opt.last_skip.undecided
    assert "(the loss was finite; float16 overflow can leave NaN here)" in (
        str(opt.last_skip))
    step()
    with pytest.raises(tf.errors.InvalidArgumentError):
        step()
    with pytest.raises(tf_lossscale.SkipStreakError) as caught:
        opt.raise_if_stuck()
    message = str(caught.value)
    assert "the last: step 2 skipped on replica 0: NaN entered at w in the " \
        "backward pass (the loss was finite); 1 of 1 gradients non-finite" \
        in message, message
    assert "It is at min_scale: the loss was finite" in message
    assert caught.value.record.undecided


@pytest.mark.parametrize("value", [0, 1.5, "3", True])
def test_a_bad_max_consecutive_skips_raises(value):
    with pytest.raises(ValueError, match="max_consecutive_skips"):
        tf_lossscale.LossScaleOptimizer(
            keras.optimizers.SGD(0.1), max_consecutive_skips=value)


def ops_outside_the_skip_branch(step: Any, n: int) -> collections.Counter:
    """The op types of `step` traced for `n` gradients of shape [3], but
    for those of every cond's skip branch (and what that calls)."""
    graph_def = step.get_concrete_function(
        [tf.TensorSpec([3])] * n).graph.as_graph_def()
    library = {f.signature.name: f for f in graph_def.library.function}
    skip = _skip_branch_functions(library, graph_def)
    assert skip, "no cond found"
    return collections.Counter(
        [x.op for x in graph_def.node] + [
            x.op for name, f in library.items() if name not in skip
            for x in f.node_def])


def _skip_branch_functions(library: Dict[str, Any], graph_def: Any) -> Set[str]:
    """The functions of every cond's false (skip) branch, and what they call."""
    names: Set[str] = set()
    for nodes in [graph_def.node] + [f.node_def for f in library.values()]:
        names.update(n.attr["else_branch"].func.name for n in nodes
                     if n.op in ("If", "StatelessIf"))
    todo = list(names)
    while todo:
        function = library.get(todo.pop())
        for node in function.node_def if function else []:
            for attr in node.attr.values():
                if attr.func.name and attr.func.name not in names:
                    names.add(attr.func.name)
                    todo.append(attr.func.name)
    return names


def _finite_path_ops(n: int, record: bool) -> collections.Counter:
    """The op types a traced `apply` of `n` variables runs when finite."""
    opt = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    variables = [keras.Variable(np.ones(3, "float32")) for _ in range(n)]
    opt.build(variables)
    if not record:  # The step as it was before the record existed.
        opt._skip_recorder = lambda grads, variables: None
    step = tf.function(lambda grads: opt.apply(grads, variables))
    return ops_outside_the_skip_branch(step, n)


def test_the_finite_path_gains_no_op_per_variable():
    added = {n: _finite_path_ops(n, True) - _finite_path_ops(n, False)
             for n in (4, 8)}
    # Only the record's variables, captured once each as inputs of the
    # cond: the same 4 whatever the number of variables, and no op runs.
    assert added[4] == added[8] == collections.Counter({"Placeholder": 4})
    assert not _finite_path_ops(4, False) - _finite_path_ops(4, True)


def test_a_nan_on_replica_1_only_is_traced_to_replica_1(mirrored_strategy):
    with mirrored_strategy.scope():
        a, b = _two_variables()
        opt = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(0.1))
        opt.build([a, b])

    def replica_step() -> None:
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        nan = tf.where(tf.equal(replica, 1), NAN, 1.0)
        opt.apply([tf.ones(3), tf.stack([1.0, nan])], [a, b])

    tf.function(lambda: mirrored_strategy.run(replica_step))()
    record = opt.last_skip
    assert (record.replica, record.replicas, record.names) == (1, 1, ("b",))
    assert str(record) == ("step 0 skipped on replica 1: 1 of 2 gradients "
                           "non-finite (NaN): b; scale 2^15")
    np.testing.assert_array_equal(b.numpy(), [1.0, 1.0])


def test_the_tf1_optimizer_stops_a_session_loop_after_k_skips():
    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable("w", initializer=[1.0, 2.0],
                                      use_resource=True)
        x = tf.compat.v1.placeholder(tf.float32, [2])
        opt = tf_lossscale.MixedPrecisionLossScaleOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(0.1), "dynamic",
            max_consecutive_skips=2)
        train = opt.minimize(tf.reduce_sum(w * x))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for row in ([NAN, 1.0], [1.0, 1.0], [NAN, 1.0]):
                sess.run(train, {x: row})  # The applied step ends the run.
            with pytest.raises(
                    tf.errors.InvalidArgumentError,
                    match=r"SkipStreakError: 2 steps in a row were skipped "
                          r"\(max_consecutive_skips=2\); the last used "
                          r"scale 8192 and had non-finite gradients: w\]"):
                sess.run(train, {x: [NAN, 1.0]})
            np.testing.assert_allclose(sess.run(w), [0.9, 1.9])
    with pytest.raises(ValueError, match="max_consecutive_skips"):
        tf_lossscale.MixedPrecisionLossScaleOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(0.1), "dynamic",
            max_consecutive_skips=0)
