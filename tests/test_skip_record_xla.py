"""The skip record inside a step compiled whole by XLA (`jit_compile=True`).

There the step's own check finds each gradient's kind in its exact branch
(`finite.Verdict.kinds`) and the record reads that one small tensor instead
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


def _reference(grads: List[np.ndarray], scale: float, both: bool
               ) -> Tuple[Tuple[str, ...], Tuple[str, ...], int]:
    """Names, kinds and count of the non-finite quotients, from NumPy.

    `both`: whether a quotient holding a NaN and an Inf is "NaN and Inf"
    (graph ops) or "NaN" (XLA, whose check's kinds tell no both)."""
    names, kinds = [], []
    for i, g in enumerate(grads):
        with np.errstate(over="ignore", invalid="ignore"):
            quotient = g.astype(np.float32) / np.float32(scale)
        if np.isnan(g).any():
            names.append(f"v{i}")
            kinds.append("NaN and Inf" if both and np.isinf(quotient).any()
                         else "NaN")
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
        names, kinds, count = _reference(grads, scale, both=not jit)
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
    # One max for the gradients of one size (the exact branch), one
    # IsFinite per gradient (the fast check of small values) and one more
    # (the exact branch's quotients), one sum (the record's first bad
    # indices): the check once.
    assert (ops["Max"], ops["IsFinite"], ops["Sum"]) == (1, n + 1, 1)


_DTYPES = [tf.float16, tf.bfloat16, tf.float32, tf.float64]


def _special(dtype: tf.DType) -> st.SearchStrategy:
    top = float(dtype.max)
    smallest_normal = {tf.float16: 2.0**-14, tf.bfloat16: 2.0**-126,
                       tf.float32: 2.0**-126, tf.float64: 2.0**-1022}[dtype]
    return st.sampled_from([0.0, 1.0, -3.0, top, -top, smallest_normal / 4,
                            np.inf, -np.inf, np.nan])


@st.composite
def _mixed_values(draw: st.DrawFn) -> List[np.ndarray]:
    values = []
    for _ in range(draw(st.integers(1, 6))):
        dtype = draw(st.sampled_from(_DTYPES))
        elements = draw(st.lists(_special(dtype), min_size=0, max_size=5))
        values.append(np.array(elements, np.float64).astype(
            dtype.as_numpy_dtype))
    return values


def _kind_reference(v: np.ndarray, scale: float) -> int:
    if np.isnan(v.astype(np.float64)).any():
        return 1  # KIND_NAN
    narrow = v.dtype.itemsize == 2
    with np.errstate(over="ignore", invalid="ignore"):
        quotient = (v.astype(np.float32) / np.float32(scale)).astype(v.dtype) \
            if narrow else v / v.dtype.type(scale)
    return 0 if np.isfinite(quotient.astype(np.float64)).all() else 2


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(values=_mixed_values(),
       scale=st.sampled_from([2.0**-3, 0.75, 1.0, 2.0**10]))
def test_the_exact_check_finds_each_kind_across_dtypes(values, scale):
    """The exact branch reads the largest magnitude's bits per value, groups
    values by dtype and puts the kinds back in order: mixed dtypes in any
    order, empty values, subnormals and quotients that overflow."""
    from tf_lossscale import finite_xla

    @tf.function(jit_compile=True)
    def check(*tensors):
        return finite_xla.verdict(list(tensors), tf.constant(scale))

    finite, kinds = check(*[tf.constant(v) for v in values])
    want = [_kind_reference(v, scale) for v in values]
    assert bool(finite) == (not any(want))
    assert kinds.numpy().tolist() == want


@pytest.mark.parametrize("dtype", _DTYPES)
def test_the_exact_check_tells_nan_from_inf_in_every_dtype(dtype):
    """Each dtype's NaN, Inf and overflowing quotient, among values of
    another dtype (hypothesis draws the first entries of a list far more
    often than the last, so every kind is spelled out here)."""
    from tf_lossscale import finite_xla
    other = tf.float64 if dtype != tf.float64 else tf.float32
    top = float(dtype.max)
    values = [tf.ones([2], other),
              tf.constant([1.0, np.nan], dtype),
              tf.constant([[np.inf], [2.0]], dtype),
              tf.constant([-np.inf, np.nan], dtype),
              tf.constant([-top], dtype),
              tf.constant([float(other.max)], other),
              tf.constant([2.0**-5], dtype)]

    @tf.function(jit_compile=True)
    def check(*tensors):
        return finite_xla.verdict(list(tensors), tf.constant(0.75))

    finite, kinds = check(*values)
    assert not bool(finite)
    assert kinds.numpy().tolist() == [0, 1, 2, 1, 2, 2, 0]


def _exact_check(values, scale):
    from tf_lossscale import finite_xla

    @tf.function(jit_compile=True)
    def check(*tensors):
        return finite_xla.verdict(list(tensors), tf.constant(scale))

    finite, kinds = check(*[tf.constant(v) for v in values])
    ops = collections.Counter(
        x.op for f in check.get_concrete_function(
            *[tf.constant(v) for v in values]).graph.as_graph_def(
            ).library.function for x in f.node_def)
    return bool(finite), kinds.numpy().tolist(), ops


def test_large_values_are_checked_by_their_sum_and_small_ones_elementwise():
    """The fast check reads a float32 value of `_SUMMED_FROM` elements or
    more through its sum (a sum that overflows falls back on the exact
    branch), a smaller one through `all(is_finite)` (issue 32): each kind
    is still found, in order."""
    from tf_lossscale import finite_xla
    big = finite_xla._SUMMED_FROM
    f32 = np.float32
    with_inf = np.ones(big, f32)
    with_inf[7] = np.inf
    with_nan = np.ones(big, f32)
    with_nan[-1] = np.nan
    small_inf = np.array([1.0, -np.inf], f32)
    overflowing = np.full(big, 3e38, f32)
    finite, kinds, ops = _exact_check(
        [np.ones(big, f32), np.ones(big - 1, f32), overflowing], 1.0)
    assert (finite, kinds) == (True, [0, 0, 0])
    # A sum per large value; IsFinite: the small value, the sums' total
    # and the exact branch's quotients.
    assert (ops["Sum"], ops["IsFinite"]) == (2, 3)
    finite, kinds, _ = _exact_check(
        [with_inf, small_inf, np.ones(3, f32), with_nan], 2.0**10)
    assert (finite, kinds) == (False, [2, 2, 0, 1])


def test_the_exact_check_keeps_each_values_kind_in_order():
    """One reduction per dtype and size (the values of one size stacked);
    kinds stay in the values' order: shapes interleaved, scalars, empty
    values, three dtypes."""
    f32, f16 = np.float32, np.float16
    values = [np.array([1.0, np.nan, 2.0], f32),
              np.ones([2, 2], f32),
              np.array([0.0, -1.0, 5.0], f32),
              np.array([[1.0, -np.inf], [0.0, 0.0]], f32),
              np.array(3e38, f32),
              np.array(1.0, f32),
              np.zeros([0], f32), np.zeros([0], f32),
              np.array([1.0, 2.0, 3.0, 4.0], f32),
              np.array([np.inf, 1.0, 2.0], f16),
              np.array([1.0, 2.0, 65504.0], f16),
              np.array([[np.nan]], np.float64)]
    finite, kinds, ops = _exact_check(values, 0.75)
    assert not finite
    assert kinds == [1, 0, 0, 2, 2, 0, 0, 0, 0, 2, 2, 1]
    assert kinds == [_kind_reference(v, 0.75) for v in values]
    assert ops["Max"] == len({(v.dtype, v.size) for v in values}) == 6


def test_the_exact_branch_takes_the_values_in_their_order():
    """The exact branch's operands are the values in the caller's order,
    whatever their dtypes and sizes: XLA schedules the whole compiled step
    after them (stacking by size must not reorder them)."""
    from tf_lossscale import finite_xla
    specs = [tf.TensorSpec(shape, dtype) for shape, dtype in (
        ((3,), tf.float32), ((2, 2), tf.float32), ((3,), tf.float16),
        ((3,), tf.float32), ((), tf.float32), ((2, 2), tf.float32))]

    @tf.function
    def check(*tensors):
        return finite_xla.verdict(list(tensors), tf.constant(2.0))

    library = check.get_concrete_function(*specs).graph.as_graph_def(
        ).library.function
    branches = [(f.signature, node) for f in library for node in f.node_def
                if node.op in ("If", "StatelessIf")]
    assert len(branches) == 1
    signature, node = branches[0]
    args = [a.name for a in signature.input_arg]
    taken = [i for i in node.input[1:] if i in args]
    assert taken == args  # every value, in order, then the scale
    assert args[-1] == "scale" and len(args) == len(specs) + 1


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(shapes=st.lists(st.sampled_from([(2,), (3,), (2, 2), ()]),
                       min_size=1, max_size=7),
       data=st.data())
def test_values_of_few_shapes_keep_their_own_kinds(shapes, data):
    """Many values of few shapes, each with its own special elements,
    against NumPy."""
    values = []
    for shape in shapes:
        size = int(np.prod(shape))
        elements = data.draw(st.lists(_special(tf.float32), min_size=size,
                                      max_size=size))
        values.append(np.array(elements, np.float32).reshape(shape))
    scale = data.draw(st.sampled_from([0.75, 1.0, 2.0**10]))
    finite, kinds, _ = _exact_check(values, scale)
    want = [_kind_reference(v, scale) for v in values]
    assert kinds == want
    assert finite == (not any(want))
