"""The finiteness check and the unscale: one place that every path uses.

`all_finite(grads)` answers "is every gradient free of NaN and +-Inf?" for
any nested structure (None ignored, `tf.IndexedSlices` checked on their
values). `unscale_and_check(grads, scale)` divides by the loss scale and runs
the same check on what it produced, which is what the optimizer applies.
`agree_across_replicas(finite)` makes every replica take the same verdict.

Cost model: on CPU and GPU alike the price of a per-tensor check is per-op
overhead, not bandwidth, so small tensors are bucketed by dtype into one
flat tensor and checked with a single reduction; large tensors are checked
in place (never copied). The test itself is `sum(x * 0)`: zero for finite
`x`, NaN as soon as one element is NaN or +-Inf, one elementwise op and one
reduction with no boolean intermediate.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import tensorflow as tf

__all__ = [
    "agree_across_replicas",
    "all_finite",
    "cross_replica_all_finite",
    "unscale",
    "unscale_and_check",
]

# Tensors with at most this many elements are concatenated into one bucket
# per dtype before the reduction; larger ones are reduced where they are.
BUCKET_MAX_ELEMENTS = 1 << 16


def _dense_values(grads: Any) -> List[tf.Tensor]:
    """The non-None gradient tensors of a nested structure, sparse as values."""
    out = []
    for g in tf.nest.flatten(grads, expand_composites=False):
        if g is None:
            continue
        if isinstance(g, tf.IndexedSlices):
            g = g.values
        out.append(tf.convert_to_tensor(g))
    return out


def _nonfinite_probe(t: tf.Tensor) -> tf.Tensor:
    """A float32 scalar: 0 if `t` is all finite, NaN otherwise."""
    return tf.cast(tf.reduce_sum(t * tf.zeros([], t.dtype)), tf.float32)


def _is_small(t: tf.Tensor) -> bool:
    n = t.shape.num_elements()
    return n is not None and n <= BUCKET_MAX_ELEMENTS


def all_finite(grads: Any) -> tf.Tensor:
    """Returns a scalar bool tensor: True iff no gradient holds NaN or +-Inf.

    Args:
      grads: any nested structure of tensors, `tf.IndexedSlices` and None.
    """
    values = _dense_values(grads)
    if not values:
        return tf.constant(True)
    probes = []
    buckets = {}
    for t in values:
        if _is_small(t):
            buckets.setdefault(t.dtype, []).append(tf.reshape(t, [-1]))
        else:
            probes.append(_nonfinite_probe(t))
    for parts in buckets.values():
        flat = parts[0] if len(parts) == 1 else tf.concat(parts, axis=0)
        probes.append(_nonfinite_probe(flat))
    total = probes[0] if len(probes) == 1 else tf.add_n(probes)
    return tf.math.is_finite(total)


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
    if grad.dtype in (tf.float16, tf.bfloat16):
        return tf.cast(tf.cast(grad, tf.float32) * inv_scale, grad.dtype)
    return grad * tf.cast(inv_scale, grad.dtype)


def unscale_and_check(
    grads: Sequence[Any], scale: Any
) -> Tuple[List[Any], tf.Tensor]:
    """Divides every gradient by `scale` and checks what that produced.

    Args:
      grads: a list of gradients (tensors, `tf.IndexedSlices` or None).
      scale: the loss scale, a float32 scalar.

    Returns:
      `(unscaled, finite)`: the unscaled list (None kept, sparse kept sparse,
      dtypes kept) and a scalar bool tensor, True iff it is all finite.
    """
    inv_scale = tf.math.reciprocal(tf.cast(scale, tf.float32))
    unscaled = [unscale(g, inv_scale) for g in grads]
    return unscaled, all_finite(unscaled)


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
