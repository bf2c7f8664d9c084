"""The finiteness check and the unscale: one place that every path uses.

`all_finite(grads)` answers "is every gradient free of NaN and +-Inf?" for
any nested structure (None ignored, `tf.IndexedSlices` checked on their
values). `unscale_and_check(grads, scale)` multiplies by `1 / scale` and
runs the same check on what it produced, which is what the optimizer
applies. `agree_across_replicas(finite)` makes every replica take the same
verdict.

Cost model (measured, see benchmarks/README.md): a per-tensor check costs
per-op overhead, not bandwidth, so gradients with at most
`BUCKET_MAX_ELEMENTS` elements are concatenated per dtype into one flat
bucket, unscaled and checked there with one multiply and one reduction, and
split back; larger ones are unscaled and reduced in place, never copied.

Two back ends compute the same verdict:

- Graph ops (CPU). A unit is finite if `reduce_sum(u)` is: one read and no
  temporary. The converse fails only when a sum of finite values overflows,
  so a non-finite total falls back, inside a `tf.cond`, to the exact
  `reduce_all(is_finite(u))`. Only steps that are skipped anyway, or whose
  gradients are near the float32 maximum, pay for it. float16/bfloat16 use
  the exact `reduce_sum(u * 0)` directly (their sums overflow often).
- XLA (GPU and TPU, or `jit_compile=True`). The buckets and the large
  tensors go through one `jit_compile` function whose probe is
  `reduce_sum(u * 0)`: zero for finite `u`, NaN otherwise, fused with the
  multiply, so the number of kernels does not grow with the number of
  gradients. `reduce_max(abs(u))` would be one op cheaper but XLA's CPU
  max drops NaN. On CPU XLA is slower than graph ops for this work, hence
  the choice by device.

Neither reads a value back to the host, and the check never retraces.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

__all__ = [
    "agree_across_replicas",
    "all_finite",
    "cross_replica_all_finite",
    "unscale",
    "unscale_and_check",
]

# Tensors with at most this many elements are concatenated into one bucket
# per dtype; larger ones (and any whose size is not static) stay in place.
BUCKET_MAX_ELEMENTS = 1 << 16

_NARROW = (tf.float16, tf.bfloat16)
_XLA_DEVICE_TYPES = ("GPU", "TPU")

# The code has no data-dependent Python control flow (tf.cond is explicit):
# letting AutoGraph convert it when a tf.function calls it only slows tracing.
_not_converted = tf.autograph.experimental.do_not_convert

# Dense values of the bucketed gradients by dtype, and of the large ones.
_Units = Tuple[Dict[tf.DType, List[tf.Tensor]], List[tf.Tensor]]


@_not_converted
def unscale(grad: Optional[Any], inv_scale: tf.Tensor) -> Optional[Any]:
    """Multiplies one gradient by `inv_scale`, keeping None, sparsity, dtype.

    Narrow float types are multiplied in float32: `1 / scale` can underflow
    in float16 (2**-25 is 0 there) even when the product is representable.
    """
    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(
            unscale(grad.values, inv_scale), grad.indices, grad.dense_shape)
    grad = tf.convert_to_tensor(grad)
    if grad.dtype in _NARROW:
        return tf.cast(tf.cast(grad, tf.float32) * inv_scale, grad.dtype)
    return grad * tf.cast(inv_scale, grad.dtype)


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
    if not values:
        return tf.constant(True)
    (buckets, large), rest = _split_for_backend(values, jit_compile)
    checks = []
    if buckets or large:
        checks.append(_xla_check(list(buckets.values()), large))
    if rest[0] or rest[1]:
        flats = [_concat(parts) for parts in rest[0].values()]
        checks.append(_graph_verdict(flats + rest[1]))
    return checks[0] if len(checks) == 1 else tf.logical_and(*checks)


@_not_converted
def unscale_and_check(
    grads: Sequence[Any], scale: Any, *, jit_compile: Optional[bool] = None
) -> Tuple[List[Any], tf.Tensor]:
    """Multiplies every gradient by `1 / scale` and checks what that produced.

    Args:
      grads: a list of gradients (tensors, `tf.IndexedSlices` or None).
      scale: the loss scale, a float32 scalar.
      jit_compile: None chooses by device (XLA on GPU/TPU, graph ops on
        CPU); True or False forces one back end.

    Returns:
      `(unscaled, finite)`: the unscaled list (None kept, sparse kept sparse,
      dtypes kept; each value equal to `unscale(g, 1 / scale)`) and a scalar
      bool tensor, True iff it is all finite.
    """
    grads = list(grads)
    inv_scale = tf.math.reciprocal(tf.cast(scale, tf.float32))
    values = [_dense_values(g) for g in grads]
    present = [v for v in values if v is not None]
    if not present:
        return grads, tf.constant(True)
    xla_units, graph_units = _split_for_backend(present, jit_compile)
    done: Dict[int, tf.Tensor] = {}
    checks = []
    if xla_units[0] or xla_units[1]:
        flats, larges, finite = _xla_unscale_and_check(
            list(xla_units[0].values()), xla_units[1], inv_scale)
        _collect(xla_units, flats, larges, done)
        checks.append(finite)
    if graph_units[0] or graph_units[1]:
        flats = [unscale(_concat(parts), inv_scale)
                 for parts in graph_units[0].values()]
        larges = [unscale(v, inv_scale) for v in graph_units[1]]
        _collect(graph_units, flats, larges, done)
        checks.append(_graph_verdict(flats + larges))
    finite = checks[0] if len(checks) == 1 else tf.logical_and(*checks)
    unscaled = [_rebuild(g, done[id(v)]) if v is not None else g
                for g, v in zip(grads, values)]
    return unscaled, finite


@_not_converted
def agree_across_replicas(finite: tf.Tensor) -> tf.Tensor:
    """In a replica context, True iff `finite` holds on every replica.

    Every replica must call it (it is a collective); each gets the same
    answer, so all of them apply or skip together. Outside any strategy it
    returns `finite` unchanged.
    """
    ctx = tf.distribute.get_replica_context()
    if ctx is None:
        raise RuntimeError(
            "agree_across_replicas() must be called in a replica context; "
            "it was called in a cross-replica context.")
    if ctx.num_replicas_in_sync == 1:
        return finite
    votes = ctx.all_reduce(
        tf.distribute.ReduceOp.SUM, tf.cast(finite, tf.float32))
    return tf.equal(votes, float(ctx.num_replicas_in_sync))


@_not_converted
def cross_replica_all_finite(grads: Any) -> tf.Tensor:
    """`all_finite` over every replica's gradients, from a cross-replica context.

    Without a strategy this is `all_finite(grads)`. Under one, each replica
    checks its own gradients and the votes are summed, so a NaN on any one
    replica makes the verdict False for all.

    Raises:
      RuntimeError: called in a replica context (inside `strategy.run`).
    """
    if not tf.distribute.has_strategy():
        return all_finite(grads)
    if not tf.distribute.in_cross_replica_context():
        raise RuntimeError(
            "LossScale.update() was called in a replica context (inside "
            "strategy.run or a replica function) under "
            f"{type(tf.distribute.get_strategy()).__name__}; call it in a "
            "cross-replica context instead: outside strategy.run, or from "
            "tf.distribute.get_replica_context().merge_call(...).")
    strategy = tf.distribute.get_strategy()
    flat = tf.nest.flatten(grads)
    votes = strategy.extended.call_for_each_replica(
        lambda g: tf.cast(all_finite(g), tf.float32), args=(flat,))
    total = strategy.reduce(tf.distribute.ReduceOp.SUM, votes, axis=None)
    return tf.equal(total, float(strategy.num_replicas_in_sync))


# --- planning: which tensors are bucketed, which back end runs them ---------

def _dense_values(grad: Any) -> Optional[tf.Tensor]:
    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):
        return grad.values
    return tf.convert_to_tensor(grad)


def _bucketable(t: tf.Tensor) -> bool:
    n = t.shape.num_elements()
    return n is not None and n <= BUCKET_MAX_ELEMENTS


def _plan(values: List[tf.Tensor]) -> _Units:
    buckets: Dict[tf.DType, List[tf.Tensor]] = {}
    large = []
    for v in values:
        if _bucketable(v):
            buckets.setdefault(v.dtype, []).append(v)
        else:
            large.append(v)
    return buckets, large


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


def _split_for_backend(values: List[tf.Tensor], jit_compile: Optional[bool]
                       ) -> Tuple[_Units, _Units]:
    """`(xla_units, graph_units)`. XLA takes only static shapes (no retrace
    per sparse batch); everything else runs as graph ops."""
    empty: _Units = ({}, [])
    if not _use_xla(values, jit_compile):
        return empty, _plan(values)
    static = [v for v in values if v.shape.is_fully_defined()]
    dynamic = [v for v in values if not v.shape.is_fully_defined()]
    return _plan(static), (({}, dynamic) if dynamic else empty)


# --- the work ---------------------------------------------------------------

def _concat(parts: List[tf.Tensor]) -> tf.Tensor:
    """One flat tensor of `parts` (one shared shape constant: tracing a
    constant per tensor costs more than the reshape itself)."""
    flat_shape = tf.constant([-1])
    flat = [p if p.shape.rank == 1 else tf.reshape(p, flat_shape)
            for p in parts]
    return flat[0] if len(flat) == 1 else tf.concat(flat, axis=0)


def _exact_probe(u: tf.Tensor) -> tf.Tensor:
    """float32 scalar: 0 if `u` is all finite, NaN otherwise."""
    return tf.cast(tf.reduce_sum(u * tf.zeros([], u.dtype)), tf.float32)


def _graph_verdict(units: List[tf.Tensor]) -> tf.Tensor:
    """True iff every unit is finite, with one read of each wide unit."""
    wide = [u for u in units if u.dtype not in _NARROW]
    probes = [_exact_probe(u) for u in units if u.dtype in _NARROW]
    probes += [tf.cast(tf.reduce_sum(u), tf.float32) for u in wide]
    fast = tf.math.is_finite(_add(probes))
    if not wide:
        return fast
    # A finite sum proves every element finite; a non-finite one may be a
    # sum of finite values that overflowed, so look again, exactly.
    return tf.cond(fast, lambda: tf.constant(True),
                   lambda: _exact_verdict(units))


def _exact_verdict(units: List[tf.Tensor]) -> tf.Tensor:
    return tf.reduce_all(tf.stack(
        [tf.reduce_all(tf.math.is_finite(u)) for u in units]))


def _add(scalars: List[tf.Tensor]) -> tf.Tensor:
    return scalars[0] if len(scalars) == 1 else tf.add_n(scalars)


def _xla_units(bucket_parts, large, inv_scale):
    flats = [unscale(_concat(parts), inv_scale) for parts in bucket_parts]
    larges = [unscale(v, inv_scale) for v in large]
    probes = [_exact_probe(u) for u in flats + larges]
    return flats, larges, tf.math.is_finite(_add(probes))


def _xla_all_finite(bucket_parts, large):
    units = [_concat(parts) for parts in bucket_parts] + list(large)
    return tf.math.is_finite(_add([_exact_probe(u) for u in units]))


_xla_unscale_and_check = tf.function(
    _xla_units, jit_compile=True, autograph=False)
_xla_check = tf.function(_xla_all_finite, jit_compile=True, autograph=False)


def _collect(units: _Units, flats: List[tf.Tensor], larges: List[tf.Tensor],
             done: Dict[int, tf.Tensor]) -> None:
    """Maps each input value (by id) to its unscaled counterpart."""
    buckets, large = units
    shapes: Dict[Tuple[int, ...], tf.Tensor] = {}
    for parts, flat in zip(buckets.values(), flats):
        pieces = ([flat] if len(parts) == 1 else
                  tf.split(flat, [p.shape.num_elements() for p in parts]))
        for part, piece in zip(parts, pieces):
            if part.shape.rank == 1:
                done[id(part)] = piece
                continue
            key = tuple(part.shape.as_list())
            if key not in shapes:
                shapes[key] = tf.constant(key, tf.int32)
            done[id(part)] = tf.reshape(piece, shapes[key])
    for v, u in zip(large, larges):
        done[id(v)] = u


def _rebuild(grad: Any, values: tf.Tensor) -> Any:
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(values, grad.indices, grad.dense_shape)
    return values
