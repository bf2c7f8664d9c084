"""The skip record inside a step compiled whole by XLA (`jit_compile=True`).

There the step's own check finds each gradient's kind in its exact branch
(`finite_xla.kinds_of`) and the record reads that one small tensor instead
of reading every gradient again. The record must say what the graph path
says, value for value (hypothesis draws the gradients of one compiled
step, compared with a NumPy reference), and add no op per variable
anywhere in the traced step, branches included.
"""

from __future__ import annotations

import collections
from typing import List, Tuple

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tf_lossscale

N_VARIABLES, SIZE = 10, 4
# 3e38 overflows when divided by a scale below 1, and four of them
# overflow a sum.
_ELEMENT = st.sampled_from([0.0, 1.0, -3.0, 3e38, np.inf, -np.inf, np.nan])


def _reference(grads: List[np.ndarray], scale: float
               ) -> Tuple[Tuple[str, ...], Tuple[str, ...], int]:
    """Names, kinds and count of the non-finite quotients, from NumPy."""
    names, kinds = [], []
    for i, g in enumerate(grads):
        with np.errstate(over="ignore", invalid="ignore"):
            quotient = g.astype(np.float32) / np.float32(scale)
        if np.isnan(g).any():
            names.append(f"v{i}")
            kinds.append("NaN")
        elif not np.isfinite(quotient).all():
            names.append(f"v{i}")
            kinds.append("Inf")
    return tuple(names[:8]), tuple(kinds[:8]), len(names)


def _step(initial_scale: float, jit_compile: bool):
    """A dynamic optimizer whose scale backs off to 0.25 at the least, and
    its `apply` as a `tf.function`."""
    variables = [keras.Variable(np.ones(SIZE, "float32"), name=f"v{i}")
                 for i in range(N_VARIABLES)]
    opt = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(0.1), initial_scale=initial_scale,
        min_scale=0.25)
    opt.build(variables)
    return opt, tf.function(lambda g: opt.apply(g, variables),
                            jit_compile=jit_compile)


@pytest.fixture(scope="module", params=[2.0**10, 1.0],
                ids=["scale_2^10", "scale_to_quarter"])
def compiled_and_graph(request):
    """The same step compiled whole by XLA and as graph ops."""
    return {jit: _step(request.param, jit) for jit in (True, False)}


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(_ELEMENT, min_size=SIZE, max_size=SIZE),
                min_size=N_VARIABLES, max_size=N_VARIABLES))
def test_under_xla_the_record_names_what_numpy_finds(compiled_and_graph,
                                                     rows):
    grads = [np.asarray(r, np.float32) for r in rows]
    for jit, (opt, step) in compiled_and_graph.items():
        scale = float(opt.loss_scale)
        names, kinds, count = _reference(grads, scale)
        before = opt.last_skip
        step([tf.constant(g) for g in grads])
        record = opt.last_skip
        if not count:  # Applied: the record is the previous one.
            assert record == before, jit
            continue
        assert (record.names, record.kinds, record.count) == (
            names, kinds, count), jit
        assert record.total == N_VARIABLES and record.scale == scale
    # Both took the same branch and so hold the same scale.
    scales = {float(opt.loss_scale) for opt, _ in compiled_and_graph.values()}
    assert len(scales) == 1


def _all_ops(n: int, record: bool) -> collections.Counter:
    """Every op of a `jit_compile=True` step of `n` variables, branches
    and the functions they call included."""
    opt = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    variables = [keras.Variable(np.ones(3, "float32")) for _ in range(n)]
    opt.build(variables)
    if not record:  # The step as it was before the record existed.
        opt._skip_recorder = lambda grads, variables: None
    step = tf.function(lambda grads: opt.apply(grads, variables),
                       jit_compile=True)
    graph_def = step.get_concrete_function(
        [tf.TensorSpec([3])] * n).graph.as_graph_def()
    return collections.Counter(
        [x.op for x in graph_def.node] + [
            x.op for f in graph_def.library.function for x in f.node_def])


def test_under_xla_the_record_adds_no_op_per_variable_even_in_its_branch():
    added = {n: _all_ops(n, True) - _all_ops(n, False) for n in (4, 8)}
    assert added[4] == added[8]
    # What reads the gradients is the check's, shared with the record.
    for op in ("IsNan", "IsInf", "Any", "Max"):
        assert added[4][op] == 0, (op, added[4])
    assert not _all_ops(4, False) - _all_ops(4, True)


def test_under_xla_the_documented_flow_traces_one_check_of_each_gradient():
    """`get_unscaled_gradients` makes no verdict there: the step checks
    the gradients where it divides them again, once. (Through identities,
    as tf_keras sums one replica's gradients, `apply_gradients` cannot
    reuse a verdict made with the quotients.)"""
    n = 5
    opt = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    variables = [keras.Variable(np.ones(3, "float32")) for _ in range(n)]
    opt.build(variables)

    @tf.function(jit_compile=True)
    def step(grads):
        unscaled = opt.get_unscaled_gradients(grads)
        opt.apply_gradients(zip([tf.identity(g) for g in unscaled],
                                variables))

    graph_def = step.get_concrete_function(
        [tf.TensorSpec([3])] * n).graph.as_graph_def()
    ops = collections.Counter(
        [x.op for x in graph_def.node] + [
            x.op for f in graph_def.library.function for x in f.node_def])
    # One max per gradient (the exact branch), one sum per gradient (the
    # fast check) and one more (the record's count): the check once.
    assert (ops["Max"], ops["Sum"]) == (n, n + 1)
