"""The finiteness check and the unscale: one place that every path uses.

`all_finite(grads)` answers "is every gradient free of NaN and +-Inf?" for
any nested structure (None ignored, `tf.IndexedSlices` checked on their
values). `unscale_and_check(grads, scale)` divides by the loss scale and
runs the same check on what it produced, which is what the optimizer
applies; `unscale_all(grads, scale)` divides without checking.
What a distribution strategy changes (the agreed verdict) is
`distribute.py`'s; this module holds the numerics only.

They divide rather than multiply by `1 / scale`: the quotient is rounded
once, and there is no reciprocal to lose. At scale 2**127 the reciprocal
is a float32 subnormal, which TensorFlow's CPU kernels flush to zero, so
multiplying by it would zero every gradient. On memory-bound tensors a
division costs what a multiply does.

Cost model (measured, see benchmarks/README.md): a per-tensor check costs
per-op overhead, not bandwidth, so gradients with at most
`BUCKET_MAX_ELEMENTS` elements are joined into buckets per dtype (along
axis 0 where `MIN_SHAPE_GROUP` or more share a trailing shape, so they need
no reshape; flattened otherwise), unscaled and checked there with one
division and one reduction, and split back; larger ones are unscaled and
reduced in place, never copied.

Two back ends compute the same verdict for a caller that is not compiled:

- Graph ops (CPU). A unit is finite if `reduce_sum(u)` is: one read and no
  temporary. The converse fails only when a sum of finite values overflows,
  so a non-finite total falls back, inside a `tf.cond`, to the exact
  `reduce_all(is_finite(u))`. Only steps that are skipped anyway, or whose
  gradients are near the float32 maximum, pay for it. float16/bfloat16 use
  the exact `reduce_all(is_finite(u))` directly: their sums overflow often,
  and for them it costs what a sum does (measured: 1.0 ms for 4M float16,
  sum 1.1 ms, `reduce_sum(u * 0)` 2.0 ms).
- XLA (GPU and TPU, or `jit_compile=True`). The buckets (flat: a reshape
  is free there) and the large tensors go through one `jit_compile`
  function whose probe is `reduce_all(is_finite(u))`, fused with the
  division, so the number of kernels does not grow with the number of
  gradients. `reduce_max(abs(u))` would be cheaper but XLA's CPU max drops
  NaN. On CPU XLA is slower than graph ops for this work, hence the choice
  by device.

A third runs inside a caller that XLA compiles whole (`jit_compile=True`,
Keras' default for `fit` on a GPU): `finite_xla.py`, one read per gradient
with the division fused into the update, no buckets (joining them would
write a copy of every gradient).

No probe multiplies by zero: TF 2.16's Grappler constant folding rewrites
`x * 0` to `0`, NaN or not, inside `tf.function`.

Neither reads a value back to the host, and the check never retraces.
"""

from __future__ import annotations

import enum
from typing import (
    Any,
    Callable,
    Dict,
    List,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
)

import tensorflow as tf

from tf_lossscale import _numerics, finite_xla

__all__ = [
    "KIND_INF",
    "KIND_NAN",
    "Mode",
    "Verdict",
    "all_finite",
    "apply_unscaled",
    "check",
    "check_unscaled",
    "compile_mode",
    "unscale_all",
    "unscale_and_check",
    "unscale_checked",
    "unscale_for_step",
]

# The pieces both back ends share (`_numerics.py`).
_NARROW = _numerics.NARROW
_add, _all = _numerics.add, _numerics.all_of
_dense_values, _rebuild = _numerics.dense_values, _numerics.rebuild
_divide, _is_finite = _numerics.divide, _numerics.is_finite

# Tensors with at most this many elements are joined into buckets; larger
# ones (and any whose size is not static) stay in place.
BUCKET_MAX_ELEMENTS = 1 << 16

_XLA_DEVICE_TYPES = ("GPU", "TPU")

# The code has no data-dependent Python control flow (tf.cond is explicit):
# letting AutoGraph convert it when a tf.function calls it only slows tracing.
_not_converted = tf.autograph.experimental.do_not_convert

# Small gradients of one dtype and trailing shape, at least this many, are
# joined along axis 0 as they are; the rest are flattened into one 1-D
# bucket per dtype (a reshape each way costs less than a bucket of its own).
MIN_SHAPE_GROUP = 4


class Mode(enum.Enum):
    """How the code being traced runs: which back end checks and unscales.

    `compile_mode` decides it once; a step hands it down to whoever needs
    it (the check, `distribute.apply_or_skip`, the skip record).
    """

    GRAPH = "graph"    # graph ops (eagerly too)
    KERNEL = "kernel"  # one XLA kernel for the check (GPU/TPU, or asked)
    WHOLE = "whole"    # inside a caller XLA compiles whole (`finite_xla`)


class Verdict(NamedTuple):
    """What a check found: whether all is finite, and (compiled whole) each
    value's kind (`KIND_NAN`, `KIND_INF` or 0), else None."""

    finite: tf.Tensor
    kinds: Optional[tf.Tensor] = None


def compile_mode(values: Sequence[tf.Tensor] = (),
                 jit_compile: Optional[bool] = None) -> Mode:
    """The back end for `values`: the one place that decides it.

    `jit_compile=None` follows the caller (compiled whole by XLA, or not)
    and the device the values live on; True forces the XLA kernel, False
    graph ops.
    """
    if jit_compile is None and finite_xla.compiled_whole():
        return Mode.WHOLE
    return Mode.KERNEL if _use_xla(list(values), jit_compile) else Mode.GRAPH


class _Bucket(NamedTuple):
    """Small gradients joined into one tensor, unscaled and checked there."""

    parts: List[tf.Tensor]
    flat: bool  # joined as 1-D (reshaped) rather than along axis 0


class _Plan(NamedTuple):
    buckets: List[_Bucket]
    large: List[tf.Tensor]  # unscaled and checked in place, never copied


@_not_converted
def all_finite(grads: Any, *, jit_compile: Optional[bool] = None
               ) -> tf.Tensor:
    """Returns a scalar bool tensor: True iff no gradient holds NaN or +-Inf.

    Args:
      grads: any nested structure of tensors, `tf.IndexedSlices` and None.
      jit_compile: None chooses by device (XLA on GPU/TPU, graph ops on
        CPU); True or False forces one back end.
    """
    values = [v for v in map(_dense_values, tf.nest.flatten(grads))
              if v is not None]
    return _check(values, compile_mode(values, jit_compile)).finite


@_not_converted
def check(grads: Sequence[Any], mode: Mode) -> Verdict:
    """`all_finite` with the back end `mode` (the kinds come compiled whole)."""
    return _check([v for v in map(_dense_values, grads) if v is not None],
                  mode)


def _check(values: List[tf.Tensor], mode: Mode) -> Verdict:
    """The one finiteness check, on dense values, by `mode`'s back end."""
    if not values:
        return Verdict(tf.constant(True))
    if mode is Mode.WHOLE:
        return Verdict(*finite_xla.verdict(values, None))
    xla_plan, graph_plan = _plans(values, mode)
    checks = []
    if xla_plan:
        checks.append(_xla_check([b.parts for b in xla_plan.buckets],
                                 xla_plan.large))
    if graph_plan:
        checks.append(_graph_verdict(
            [_join(b) for b in graph_plan.buckets] + graph_plan.large))
    return Verdict(_all(checks))


KIND_NAN, KIND_INF = finite_xla.KIND_NAN, finite_xla.KIND_INF


@_not_converted
def apply_unscaled(apply: Callable[[List[Any]], Any], grads: Sequence[Any],
                   scale: Any, by_reciprocal: bool) -> None:
    """Runs `apply(unscale_all(grads, scale))` in an apply branch that XLA
    compiles whole, so the unscale fuses into the update and no unscaled
    gradient is written out (`finite_xla.apply_unscaled`). With
    `by_reciprocal` (every scale is a power of two) it multiplies by the
    reciprocal, the same bits as dividing."""
    finite_xla.apply_unscaled(apply, list(grads), tf.cast(scale, tf.float32),
                              by_reciprocal)


@_not_converted
def check_unscaled(grads: Sequence[Any], scale: Any, mode: Mode) -> Verdict:
    """Whether all of `unscale_all(grads, scale)` is finite.

    Compiled whole by XLA this divides nothing: one reduction per gradient
    (the largest magnitude's bits) and one division of the largest, and the
    kinds come with it; elsewhere it is `unscale_and_check`'s verdict.
    """
    values = [v for v in map(_dense_values, grads) if v is not None]
    if not values:
        return Verdict(tf.constant(True))
    if mode is Mode.WHOLE:
        return Verdict(*finite_xla.verdict(
            values, finite_xla.runtime_scale(scale)))
    return unscale_checked(grads, scale, mode)[1]


@_not_converted
def unscale_and_check(
    grads: Sequence[Any], scale: Any, *, jit_compile: Optional[bool] = None
) -> Tuple[List[Any], tf.Tensor]:
    """Divides every gradient by `scale` and checks what that produced.

    Args:
      grads: a list of gradients (tensors, `tf.IndexedSlices` or None).
      scale: the loss scale, a float32 scalar.
      jit_compile: None chooses by device (XLA on GPU/TPU, graph ops on
        CPU); True or False forces one back end.

    Returns:
      `(unscaled, finite)`: `unscale_all(grads, scale)` and a scalar bool
      tensor, True iff all of it is finite.
    """
    unscaled, verdict = unscale_checked(grads, scale,
                                        _mode_of(grads, jit_compile))
    return unscaled, verdict.finite


@_not_converted
def unscale_checked(grads: Sequence[Any], scale: Any, mode: Mode
                    ) -> Tuple[List[Any], Verdict]:
    """`unscale_and_check` with the back end `mode`."""
    unscaled, verdict = _unscale(grads, scale, mode, check=True)
    assert verdict is not None
    return unscaled, verdict


@_not_converted
def unscale_for_step(grads: Sequence[Any], scale: Any
                     ) -> Tuple[List[Any], Optional[tf.Tensor]]:
    """`unscale_and_check`, for a step that may reuse the verdict.

    The check comes with the division at almost no cost, so an
    `apply_gradients` handed exactly these quotients reuses it (a traced
    graph drops it when nothing reads it). Inside a caller compiled whole
    by XLA the verdict is None: there the step checks the scaled
    gradients again where it divides them (`GradientMarks` tells it what
    was divided), and a verdict made here would only be traced and
    compiled for nothing.
    """
    mode = _mode_of(grads, None)
    if mode is Mode.WHOLE:
        return _unscale(grads, scale, mode, check=False)[0], None
    unscaled, verdict = unscale_checked(grads, scale, mode)
    return unscaled, verdict.finite


@_not_converted
def unscale_all(grads: Sequence[Any], scale: Any, *,
                jit_compile: Optional[bool] = None) -> List[Any]:
    """Divides every gradient by `scale`; None kept, sparse kept sparse.

    Each value is `g / scale` rounded once to the gradient's dtype (float16
    and bfloat16 are divided in float32, so no intermediate underflows),
    computed with the buckets of `unscale_and_check`.

    Args:
      grads: a list of gradients (tensors, `tf.IndexedSlices` or None).
      scale: the loss scale, a float32 scalar.
      jit_compile: as for `unscale_and_check`.
    """
    return _unscale(grads, scale, _mode_of(grads, jit_compile),
                    check=False)[0]


def _mode_of(grads: Sequence[Any], jit_compile: Optional[bool]) -> Mode:
    """`compile_mode` of the gradients' dense values."""
    return compile_mode([v for v in map(_dense_values, grads)
                         if v is not None], jit_compile)


def _unscale(grads: Sequence[Any], scale: Any, mode: Mode,
             check: bool) -> Tuple[List[Any], Optional[Verdict]]:
    grads = list(grads)
    scale = tf.cast(scale, tf.float32)
    values = [_dense_values(g) for g in grads]
    present = [v for v in values if v is not None]
    if not present:
        return grads, Verdict(tf.constant(True))
    if mode is Mode.WHOLE:
        unscaled, found = finite_xla.unscale(grads, values, scale, check)
        return unscaled, (None if found is None else Verdict(*found))
    xla_plan, graph_plan = _plans(present, mode)
    done: Dict[int, tf.Tensor] = {}  # id(dense value) -> unscaled value
    checks = []
    if xla_plan:
        checks.append(_xla_run(xla_plan, scale, done))
    if graph_plan:
        checks.append(_graph_unscale(graph_plan, scale, done, check))
    unscaled = [g if v is None else _rebuild(g, done[id(v)])
                for g, v in zip(grads, values)]
    return unscaled, (Verdict(_all(checks)) if check else None)


# --- planning: which tensors are bucketed, which back end runs them ---------

def _bucketable(t: tf.Tensor) -> bool:
    n = t.shape.num_elements()
    return n is not None and n <= BUCKET_MAX_ELEMENTS


def _plan(values: List[tf.Tensor], by_shape: bool) -> _Plan:
    """Buckets the small tensors: per dtype, and with `by_shape` also per
    trailing shape where at least `MIN_SHAPE_GROUP` share one."""
    large = [v for v in values if not _bucketable(v)]
    groups: Dict[Tuple[Any, ...], List[tf.Tensor]] = {}
    flat: Dict[tf.DType, List[tf.Tensor]] = {}
    for v in values:
        if not _bucketable(v):
            continue
        if by_shape and v.shape.rank > 1:
            groups.setdefault((v.dtype, *v.shape.as_list()[1:]), []).append(v)
        else:
            flat.setdefault(v.dtype, []).append(v)
    buckets = []
    for parts in groups.values():
        if len(parts) >= MIN_SHAPE_GROUP:
            buckets.append(_Bucket(parts, flat=False))
        else:
            flat.setdefault(parts[0].dtype, []).extend(parts)
    buckets += [_Bucket(parts, flat=True) for parts in flat.values()]
    return _Plan(buckets, large)


def _use_xla(values: List[tf.Tensor], jit_compile: Optional[bool]) -> bool:
    """XLA if asked; by default on GPU/TPU, judged by where tensors live."""
    if jit_compile is not None:
        return bool(jit_compile)
    for v in values:
        if v.device:
            kind = tf.DeviceSpec.from_string(v.device).device_type
            return kind in _XLA_DEVICE_TYPES
    return any(tf.config.list_logical_devices(kind)
               for kind in _XLA_DEVICE_TYPES)


def _plans(values: List[tf.Tensor], mode: Mode
           ) -> Tuple[Optional[_Plan], Optional[_Plan]]:
    """`(xla_plan, graph_plan)`, either None when it has nothing to do.

    XLA takes only static shapes (a sparse gradient's row count changes
    from step to step, and each new shape would compile again); the rest
    runs as graph ops. XLA flattens everything (a reshape is free there).
    """
    if mode is not Mode.KERNEL:
        return None, _plan(values, by_shape=True)
    static = [v for v in values if v.shape.is_fully_defined()]
    dynamic = [v for v in values if not v.shape.is_fully_defined()]
    return (_plan(static, by_shape=False) if static else None,
            _Plan([], dynamic) if dynamic else None)


# --- joining and splitting buckets -----------------------------------------

def _join(bucket: _Bucket) -> tf.Tensor:
    """The bucket as one tensor (one shared shape constant: tracing one per
    tensor costs more than the reshape itself)."""
    parts = bucket.parts
    if bucket.flat:
        flat_shape = tf.constant([-1])
        parts = [p if p.shape.rank == 1 else tf.reshape(p, flat_shape)
                 for p in parts]
    return parts[0] if len(parts) == 1 else tf.concat(parts, axis=0)


def _split(bucket: _Bucket, joined: tf.Tensor,
           shapes: Dict[Tuple[int, ...], tf.Tensor]) -> List[tf.Tensor]:
    """The inverse of `_join`, applied to the bucket's unscaled tensor."""
    parts = bucket.parts
    if len(parts) == 1:
        pieces = [joined]
    else:
        sizes = [p.shape.num_elements() if bucket.flat
                 else p.shape.as_list()[0] for p in parts]
        pieces = tf.split(joined, sizes)
    out = []
    for part, piece in zip(parts, pieces):
        if bucket.flat and part.shape.rank != 1:
            key = tuple(part.shape.as_list())
            if key not in shapes:
                shapes[key] = tf.constant(key, tf.int32)
            piece = tf.reshape(piece, shapes[key])
        out.append(piece)
    return out


def _map_back(plan: _Plan, joined: List[tf.Tensor], large: List[tf.Tensor],
              done: Dict[int, tf.Tensor]) -> None:
    """Maps each input value (by id) to its unscaled counterpart."""
    shapes: Dict[Tuple[int, ...], tf.Tensor] = {}
    for bucket, unit in zip(plan.buckets, joined):
        for part, piece in zip(bucket.parts, _split(bucket, unit, shapes)):
            done[id(part)] = piece
    for v, u in zip(plan.large, large):
        done[id(v)] = u


# --- the verdict ------------------------------------------------------------

def _graph_verdict(units: List[tf.Tensor]) -> tf.Tensor:
    """True iff every unit is finite, with one read of each unit."""
    wide = [u for u in units if u.dtype not in _NARROW]
    exact = [_is_finite(u) for u in units if u.dtype in _NARROW]
    if wide:
        sums = [tf.cast(tf.reduce_sum(u), tf.float32) for u in wide]
        # A finite sum proves every element finite; a non-finite one may be
        # a sum of finite values that overflowed, so look again, exactly.
        exact.append(tf.cond(tf.math.is_finite(_add(sums)),
                             lambda: tf.constant(True),
                             lambda: _exact_verdict(wide)))
    return _all(exact)


def _exact_verdict(units: List[tf.Tensor]) -> tf.Tensor:
    return tf.reduce_all(tf.stack([_is_finite(u) for u in units]))


# --- the two back ends ------------------------------------------------------

def _graph_unscale(plan: _Plan, scale: tf.Tensor, done: Dict[int, tf.Tensor],
                   check: bool) -> Optional[tf.Tensor]:
    joined = [_divide(_join(b), scale) for b in plan.buckets]
    large = [_divide(v, scale) for v in plan.large]
    _map_back(plan, joined, large, done)
    return _graph_verdict(joined + large) if check else None


def _xla_units(bucket_parts: List[List[tf.Tensor]], large: List[tf.Tensor],
               scale: Optional[tf.Tensor]):
    """Flat buckets and large tensors, unscaled unless `scale` is None, and
    the exact verdict (fused with the division by XLA)."""
    units = [_join(_Bucket(parts, flat=True)) for parts in bucket_parts]
    units += list(large)
    if scale is not None:
        units = [_divide(u, scale, tf.math.divide) for u in units]
    return units, _all([_is_finite(u) for u in units])


def _xla_unscale_and_check_kernel(bucket_parts, large, scale):
    units, finite = _xla_units(bucket_parts, large, scale)
    return units[:len(bucket_parts)], units[len(bucket_parts):], finite


def _xla_check_kernel(bucket_parts, large):
    return _xla_units(bucket_parts, large, None)[1]


_xla_unscale_and_check = tf.function(
    _xla_unscale_and_check_kernel, jit_compile=True, autograph=False)
_xla_check = tf.function(_xla_check_kernel, jit_compile=True, autograph=False)


def _xla_run(plan: _Plan, scale: tf.Tensor,
             done: Dict[int, tf.Tensor]) -> tf.Tensor:
    joined, large, finite = _xla_unscale_and_check(
        [b.parts for b in plan.buckets], plan.large, scale)
    _map_back(plan, joined, large, done)
    return finite
