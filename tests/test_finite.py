"""The fused finiteness check and unscale (tf_lossscale/finite.py).

The property tests compare the fused, bucketed check against the plain
per-tensor check `reduce_all(is_finite(g))` and the fused unscale against
the per-tensor `unscale`, on random lists that mix NaN, +-Inf, the largest
finite values (whose sums overflow), subnormals, empty tensors,
`IndexedSlices` and None in four dtypes, with many small tensors (bucketed)
and a few large ones (checked in place), eagerly, in `tf.function` and
under XLA.
"""

import gc
import re
import weakref

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tf_lossscale import distribute, finite

DTYPES = [tf.float16, tf.bfloat16, tf.float32, tf.float64]
LARGE = finite.BUCKET_MAX_ELEMENTS + 11
SPECIALS = ["nan", "inf", "-inf", "max", "-max", "subnormal", "zero"]


def _special(name, dtype):
    info = {
        "max": float(dtype.max), "-max": -float(dtype.max),
        "subnormal": {tf.float16: 2.0 ** -24, tf.bfloat16: 2.0 ** -133,
                      tf.float32: 2.0 ** -149,
                      tf.float64: 5e-324}[dtype],
        "nan": np.nan, "inf": np.inf, "-inf": -np.inf, "zero": 0.0}
    return info[name]


@st.composite
def gradient(draw, kind=None, dtype=None):
    kind = kind or draw(st.sampled_from(
        ["none", "dense", "dense", "dense", "matrix", "sparse", "empty",
         "large"]))
    if kind == "none":
        return None
    dtype = dtype or draw(st.sampled_from(DTYPES))
    shape = {"dense": [draw(st.integers(1, 40))],
             # Few trailing shapes, so that groups joined along axis 0 form.
             "matrix": [draw(st.integers(1, 6)),
                        draw(st.sampled_from([3, 5]))],
             "sparse": [draw(st.integers(1, 4)), 3],
             "empty": [draw(st.sampled_from([0, 3])), 0],
             "large": [LARGE]}[kind]
    size = int(np.prod(shape))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 16)))
    values = rng.standard_normal(size) * 10.0 ** draw(st.integers(-3, 3))
    if size and draw(st.booleans()):
        # All at the dtype's maximum: a finite tensor whose sum overflows.
        values[:] = _special("max", dtype)
    for _ in range(draw(st.integers(0, 2)) if size else 0):
        name = draw(st.sampled_from(SPECIALS))
        values[draw(st.integers(0, size - 1))] = _special(name, dtype)
    tensor = tf.cast(tf.constant(values.reshape(shape), tf.float64), dtype)
    if kind != "sparse":
        return tensor
    return tf.IndexedSlices(tensor, tf.range(shape[0]) * 2,
                            tf.constant([2 * shape[0], 3]))


@st.composite
def gradient_lists(draw):
    """Single gradients, and families of 4-6 matrices of one dtype and
    trailing shape (which are joined along axis 0 rather than flattened)."""
    grads = []
    for _ in range(draw(st.integers(0, 10))):
        if draw(st.integers(0, 3)) == 0:
            dtype = draw(st.sampled_from(DTYPES))
            grads += [draw(gradient("matrix", dtype))
                      for _ in range(draw(st.integers(4, 6)))]
        else:
            grads.append(draw(gradient()))
    return grads


def _values(g):
    return g.values if isinstance(g, tf.IndexedSlices) else g


def _reference_check(grads):
    """The plain per-tensor check."""
    return all(bool(tf.reduce_all(tf.math.is_finite(_values(g))))
               for g in grads if g is not None)


def _run(mode, fn):
    if mode == "eager":
        return fn(None)
    if mode == "function":
        return tf.function(lambda: fn(None), autograph=False)()
    return fn(True)


def _divided(g, scale):
    """The per-tensor unscale, eagerly: `g / scale`, narrow types via
    float32. (In a graph, Grappler turns a division by a constant into a
    multiply by its reciprocal, which rounds differently.)"""
    if g is None:
        return None
    if isinstance(g, tf.IndexedSlices):
        return tf.IndexedSlices(_divided(g.values, scale), g.indices,
                                g.dense_shape)
    if g.dtype in (tf.float16, tf.bfloat16):
        return tf.cast(tf.cast(g, tf.float32) / scale, g.dtype)
    return g / tf.constant(scale, g.dtype)


def _flushed(t):
    """Exact values as float64, subnormals as zero. TensorFlow's CPU kernels
    flush subnormal results to zero on some threads and not on others, so a
    subnormal result may come out as either, depending on which ran it."""
    values = tf.cast(t, tf.float64).numpy()
    tiny = np.finfo(np.float64).tiny if t.dtype == tf.float64 else {
        tf.float16: 2.0 ** -14, tf.bfloat16: 2.0 ** -126,
        tf.float32: 2.0 ** -126}[t.dtype]
    return np.where(np.abs(values) < tiny, 0.0, values)


SETTINGS = dict(deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow,
                                       HealthCheck.data_too_large])
MODES = [("eager", 40), ("function", 15), ("xla", 8)]


@pytest.mark.parametrize("mode,examples", MODES, ids=[m for m, _ in MODES])
def test_fused_check_agrees_with_per_tensor_check(mode, examples):
    @settings(max_examples=examples, **SETTINGS)
    @given(gradient_lists())
    def check(grads):
        verdict = _run(mode, lambda jit: finite.all_finite(
            grads, jit_compile=jit))
        assert bool(verdict) == _reference_check(grads)

    check()


@pytest.mark.parametrize("mode,examples", MODES, ids=[m for m, _ in MODES])
def test_fused_unscale_and_check_equals_per_tensor_work(mode, examples):
    @settings(max_examples=examples, **SETTINGS)
    @given(gradient_lists(), st.sampled_from([1.0, 3.0, 2.0 ** 15, 2.0 ** 40]))
    def check(grads, scale):
        unscaled, verdict = _run(mode, lambda jit: finite.unscale_and_check(
            grads, tf.constant(scale), jit_compile=jit))
        expected = [_divided(g, scale) for g in grads]
        for got, want in zip(unscaled, expected):
            assert type(got) is type(want)
            if want is None:
                continue
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(_flushed(_values(got)),
                                          _flushed(_values(want)))
        assert bool(verdict) == _reference_check(expected)

    check()


@pytest.mark.parametrize("mode", ["eager", "function", "xla"])
def test_float16_unscale_is_exact_for_power_of_two_scales(mode):
    # Every float16 magnitude class: subnormals, normals, the maximum.
    grad_np = np.array([2.0 ** -24, 3 * 2.0 ** -24, 2.0 ** -14, 0.1, 1.0,
                        1.5, 1000.0, 65504.0, -65504.0, -0.0],
                       np.float16)
    grads = [tf.constant(grad_np),
             tf.constant(np.tile(grad_np, LARGE // 10 + 1))]
    fused = tf.function(lambda g, s: finite.unscale_and_check(
        g, s, jit_compile=mode == "xla"), autograph=False)
    if mode == "eager":
        fused = finite.unscale_and_check
    for k in range(0, 41):
        unscaled, ok = fused(grads, tf.constant(2.0 ** k))
        want = (grad_np.astype(np.float64) / 2.0 ** k).astype(np.float16)
        np.testing.assert_array_equal(unscaled[0].numpy(), want)
        np.testing.assert_array_equal(unscaled[1].numpy()[:10], want)
        assert bool(ok)


@pytest.mark.parametrize("mode", ["eager", "function", "xla"])
def test_scale_2_127_unscales_float32_exactly(mode):
    # 1 / 2**127 is a float32 subnormal that TensorFlow's CPU kernels flush
    # to zero: multiplying by it would zero every gradient.
    scale = 2.0 ** 127
    grads = [tf.constant([3.0e38, -1.5e30, 2.0 ** 100]),
             tf.fill([LARGE], 2.0 ** 120)]
    unscaled, ok = _run(mode, lambda jit: finite.unscale_and_check(
        grads, tf.constant(scale), jit_compile=jit))
    want = np.array([3.0e38, -1.5e30, 2.0 ** 100], np.float32) / np.float32(
        scale)
    np.testing.assert_array_equal(unscaled[0].numpy(), want)
    assert want[2] == 2.0 ** -27
    assert (unscaled[1].numpy() == 2.0 ** -7).all()
    assert bool(ok)


def test_unscale_all_is_the_unscale_of_unscale_and_check():
    grads = [tf.constant([[3.0]], tf.float16), None,
             tf.IndexedSlices(tf.constant([[6.0, 9.0]]), tf.constant([0]),
                              tf.constant([2, 2])),
             tf.fill([LARGE], np.nan)]
    alone = finite.unscale_all(grads, tf.constant(3.0))
    checked, ok = finite.unscale_and_check(grads, tf.constant(3.0))
    assert alone[1] is None and isinstance(alone[2], tf.IndexedSlices)
    assert alone[0].dtype == tf.float16 and alone[0].numpy() == [[1.0]]
    assert alone[2].values.numpy().tolist() == [[2.0, 3.0]]
    for a, b in zip(alone, checked):
        if a is not None:
            np.testing.assert_array_equal(_values(a), _values(b))
    assert not bool(ok)


def test_unscale_keeps_none_sparsity_and_dtype():
    sparse = tf.IndexedSlices(tf.constant([[2.0, 4.0]], tf.bfloat16),
                              tf.constant([1]), tf.constant([3, 2]))
    grads = [None, sparse, tf.constant([8.0], tf.float64),
             tf.constant([[6.0]], tf.float16)]
    unscaled, ok = finite.unscale_and_check(grads, tf.constant(2.0))
    assert unscaled[0] is None
    assert isinstance(unscaled[1], tf.IndexedSlices)
    assert unscaled[1].indices is sparse.indices
    assert unscaled[1].values.dtype == tf.bfloat16
    assert unscaled[1].values.numpy().tolist() == [[1.0, 2.0]]
    assert unscaled[2].dtype == tf.float64 and unscaled[2].numpy() == [4.0]
    assert unscaled[3].dtype == tf.float16 and unscaled[3].shape == (1, 1)
    assert bool(ok)


def test_finite_values_whose_sum_overflows_are_finite():
    huge = tf.fill([LARGE], 3e38)
    small = [tf.fill([50], 3e38) for _ in range(3)]
    graph_check = tf.function(lambda g: finite.all_finite(g))
    assert bool(finite.all_finite([huge] + small))
    assert bool(graph_check([huge] + small))
    assert not bool(graph_check([huge, tf.constant([np.inf])]))
    assert not bool(graph_check([huge, tf.constant([-np.inf])]))


def _graph_ops(fn, *args):
    graph = tf.function(fn, autograph=False).get_concrete_function(
        *args).graph
    ops = [op.type for op in graph.get_operations()]
    for f in graph._functions.values():  # XLA-compiled inner functions
        ops += [node.op for node in f.cached_definition.node_def]
    return ops


def test_small_gradients_are_checked_with_one_reduction_per_bucket():
    grads = ([tf.TensorSpec([7, 3])] * 150 + [tf.TensorSpec([5])] * 150
             + [tf.TensorSpec([4], tf.float64)] * 20)
    ops = _graph_ops(lambda *g: finite.unscale_and_check(g, 8.0), *grads)
    # Three buckets: the [7, 3] gradients joined along axis 0 (no reshape),
    # the float32 vectors, the float64 vectors. Each is one concat, one
    # division and one sum (the exact fallback, which runs only on a
    # non-finite sum, uses All).
    assert ops.count("ConcatV2") == 3
    assert ops.count("DivNoNan") == 3
    assert ops.count("Sum") == 3
    assert ops.count("Reshape") == 0


def test_odd_shapes_are_flattened_into_the_dtype_bucket():
    grads = [tf.TensorSpec([2, 3, 4]), tf.TensorSpec([6, 1]),
             tf.TensorSpec([5]), tf.TensorSpec([])]
    ops = _graph_ops(lambda *g: finite.unscale_and_check(g, 8.0), *grads)
    assert ops.count("ConcatV2") == 1
    assert ops.count("Sum") == 1
    assert ops.count("Reshape") == 6  # 3 tensors, flattened and restored


def test_large_gradients_are_not_copied():
    grads = [tf.TensorSpec([LARGE])] * 3
    ops = _graph_ops(lambda *g: finite.unscale_and_check(g, 8.0), *grads)
    assert "ConcatV2" not in ops
    assert ops.count("DivNoNan") == 3


def test_back_end_follows_the_device_of_the_gradients():
    def traced(device, jit=None):
        def fn():
            with tf.device(device):
                grads = [tf.ones([4]) for _ in range(3)]
            return finite.unscale_and_check(grads, 2.0, jit_compile=jit)
        return [op.type for op in tf.function(fn).get_concrete_function()
                .graph.get_operations()]

    calls = ("PartitionedCall", "StatefulPartitionedCall")
    assert not any(t in calls for t in traced("/CPU:0"))
    assert any(t in calls for t in traced("/GPU:0"))
    assert any(t in calls for t in traced("/CPU:0", jit=True))


def _xla_fusions(count, size):
    # The kernel unscale_and_check(jit_compile=True) runs for one bucket of
    # `count` float32 gradients of `size` elements (no large ones).
    bucket = [[tf.ones([size]) for _ in range(count)]]
    hlo = finite._xla_unscale_and_check.experimental_get_compiler_ir(
        bucket, [], tf.constant(0.5))(stage="optimized_hlo")
    return len(re.findall(r"= \S+ fusion\(", hlo))


def test_xla_fusion_count_does_not_grow_with_the_number_of_gradients():
    # Same bytes in 10 and in 100 tensors. (XLA's CPU tree reduction adds a
    # stage as the element count grows by 32x; that is bytes, not tensors.)
    assert _xla_fusions(10, 10000) == _xla_fusions(100, 1000) <= 6


def test_replicas_agree_when_only_one_sees_a_nan(mirrored_strategy):
    def step():
        ctx = tf.distribute.get_replica_context()
        bad = tf.equal(ctx.replica_id_in_sync_group, 1)
        grad = tf.where(bad, np.nan, 1.0) * tf.ones([3])
        _, ok = finite.unscale_and_check([grad], 2.0)
        return ok, distribute.agree(ok)

    own, agreed = mirrored_strategy.run(tf.function(step))
    assert [bool(v) for v in mirrored_strategy.experimental_local_results(
        own)] == [True, False]
    assert [bool(v) for v in mirrored_strategy.experimental_local_results(
        agreed)] == [False, False]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("how", ["eager", "function", "xla"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_value_is_caught_however_the_check_runs(dtype, how, bad):
    """Grappler's default options are on inside tf.function: TF 2.16 folds
    `x * 0` to 0 there, NaN or not, so no probe may rest on it."""
    values = np.ones(7, np.float32)
    values[3] = bad
    grads = [tf.cast(tf.constant(values), dtype), tf.ones([3, 5], dtype)]
    check = {"eager": finite.all_finite,
             "function": tf.function(finite.all_finite),
             "xla": tf.function(
                 lambda g: finite.all_finite(g, jit_compile=True))}[how]
    assert not bool(check(grads))
    assert bool(check([tf.ones([7], dtype), tf.ones([3, 5], dtype)]))
    unscaled, ok = tf.function(finite.unscale_and_check)(grads, 4.0)
    assert not bool(ok)


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float32])
def test_no_probe_multiplies_by_zero(dtype):
    """The old float16 probe `reduce_sum(u * 0)` is what Grappler folds."""
    graph = tf.function(finite.all_finite).get_concrete_function(
        [tf.TensorSpec([8], dtype), tf.TensorSpec([4, 4], dtype)]).graph
    ops = {op.type for op in graph.get_operations()}
    assert "Mul" not in ops and "IsFinite" in ops


def test_what_the_xla_path_learns_travels_as_values_and_dies_with_its_graph():
    """Compiled whole, the documented flow's step finds what was divided
    through the optimizer's marks (`Taken.undivided`) and the kinds as
    the check's value: no module keeps a table of tensors, and a traced
    function, once gone, takes its graph with it."""
    import keras

    from tf_lossscale import LossScaleOptimizer, finite_xla
    from tf_lossscale.gradient_marks import GradientMarks

    for module in (finite, finite_xla):
        tables = [name for name, value in vars(module).items()
                  if isinstance(value, (dict, weakref.WeakKeyDictionary))
                  and not name.startswith("__") and name != "_BITS"]
        assert tables == [], (module.__name__, tables)

    graphs = []
    found = []

    @tf.autograph.experimental.do_not_convert
    def body(g):
        graphs.append(weakref.ref(tf.compat.v1.get_default_graph()))
        marks = GradientMarks()
        divided = finite.unscale_all([g], 4.0)
        marks.unscaled([g], divided, None, tf.constant(4.0))
        origin = marks.take(divided).undivided(divided)
        found.append(origin is not None and origin[0][0] is g)
        return finite_xla.verdict([g], None)[1]

    step = tf.function(body, jit_compile=True)
    kinds = step(tf.constant([4.0, 8.0]))
    assert found == [True]
    assert kinds.numpy().tolist() == [0]
    del step, body
    gc.collect()
    assert graphs and graphs[0]() is None

    # Through the optimizer: the step divides again where it applies.
    var = keras.Variable([1.0, 2.0])
    opt = LossScaleOptimizer(keras.optimizers.SGD(0.5), initial_scale=4.0)

    @tf.function(jit_compile=True)
    def documented(g):
        opt.apply_gradients(zip(opt.get_unscaled_gradients([g]), [var]))

    documented(tf.constant([4.0, 8.0]))
    assert var.numpy().tolist() == [0.5, 1.0]
    documented(tf.constant([np.inf, 8.0]))
    assert var.numpy().tolist() == [0.5, 1.0]
    assert float(opt.loss_scale) == 2.0


@pytest.mark.parametrize("name", [
    "all_finite", "apply_unscaled", "check_unscaled", "unscale_and_check",
    "unscale_for_step", "unscale_all"])
def test_the_traced_entry_points_are_not_converted_by_autograph(name):
    """They hold no data-dependent Python control flow, and AutoGraph's
    conversion cost about a second of every process's first call; a
    function inserted above one of them once took its decorator."""
    assert hasattr(getattr(finite, name), "autograph_info__")
