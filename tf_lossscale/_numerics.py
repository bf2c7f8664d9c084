"""The division and the small reductions that every check shares.

`finite.py` (graph ops, and the XLA kernel of a GPU) and `finite_xla.py`
(a caller that XLA compiles whole) divide by the loss scale with the same
`divide` and combine verdicts the same way; this module holds only those
pieces, so neither back end imports the other's internals.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

import tensorflow as tf

__all__ = ["NARROW", "add", "all_axes", "all_of", "dense_values", "divide",
           "is_finite", "multiply", "rebuild"]

NARROW = (tf.float16, tf.bfloat16)


def divide(t: tf.Tensor, scale: tf.Tensor,
           divide_fn: Callable[..., tf.Tensor] = tf.math.divide_no_nan
           ) -> tf.Tensor:
    """`t / scale` (a positive float32 scalar), rounded once to `t`'s dtype.

    float16 and bfloat16 are divided in float32, so no intermediate
    underflows. `divide_no_nan` by default because Grappler rewrites
    `Div`/`RealDiv` by a constant into a multiply by the reciprocal (the
    very thing to avoid) and leaves `DivNoNan` alone; for a positive
    `scale` both divide. Under XLA `scale` is a runtime value and a plain
    divide is one fusion fewer.
    """
    if t.dtype in NARROW:
        return tf.cast(divide_fn(tf.cast(t, tf.float32), scale), t.dtype)
    return divide_fn(t, tf.cast(scale, t.dtype))


def multiply(t: tf.Tensor, *factors: tf.Tensor) -> tf.Tensor:
    """`t` times each float32 scalar of `factors` in turn, rounded to `t`'s
    dtype once: `divide`'s twin (float16 and bfloat16 in float32)."""
    narrow = t.dtype in NARROW
    wide = tf.cast(t, tf.float32) if narrow else t
    for factor in factors:
        wide = tf.math.multiply(
            wide, factor if factor.dtype == wide.dtype
            else tf.cast(factor, wide.dtype))
    return tf.cast(wide, t.dtype) if narrow else wide


def dense_values(grad: Any) -> Optional[tf.Tensor]:
    """The values to check: a tensor's own, an `IndexedSlices`' values."""
    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):
        return grad.values
    return tf.convert_to_tensor(grad)


def rebuild(grad: Any, values: tf.Tensor) -> Any:
    """`values` in the form of `grad` (sparse stays sparse)."""
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(values, grad.indices, grad.dense_shape)
    return values


def all_axes(t: tf.Tensor, cache: Dict[int, tf.Tensor]
             ) -> Optional[tf.Tensor]:
    """The axes that reduce `t` whole, one constant per rank in `cache`.

    A reduction without axes traces a constant of its own; code that
    reduces one tensor per gradient shares them (None: unknown rank).
    """
    rank = t.shape.rank
    if rank is None:
        return None
    if rank not in cache:
        cache[rank] = tf.constant(list(range(rank)), tf.int32)
    return cache[rank]


def is_finite(u: tf.Tensor) -> tf.Tensor:
    """Scalar bool, exact: no graph optimizer can fold it."""
    return tf.reduce_all(tf.math.is_finite(u))


def add(scalars: List[tf.Tensor]) -> tf.Tensor:
    return scalars[0] if len(scalars) == 1 else tf.add_n(scalars)


def all_of(checks: List[tf.Tensor]) -> tf.Tensor:
    if len(checks) == 1:
        return checks[0]
    return tf.reduce_all(tf.stack(checks))
