"""The check and the unscale inside a caller that XLA compiles whole.

Under `jit_compile=True` (Keras' default for `fit` on a GPU) XLA fuses
across the whole step, and what costs is what it must write out. Measured
in the optimized HLO of a compiled step (benchmarks/hlo_step.py):

- A division used by two kernels (the check and the update) is written out
  once for both (XLA does not repeat a division), and one computed before
  a conditional and used inside it is written out too. So the step checks
  the scaled gradients and divides them inside its apply branch, where the
  division fuses into the update and no unscaled gradient is written.
- XLA's CPU reductions read a gradient in place only when nothing is fused
  into them: `reduce_sum(g)` reads it once, while `max(|g|)` or
  `all(is_finite(g))` first write a temporary. So the verdict is one sum
  per gradient; a finite total proves every gradient finite, and dividing
  a finite value by a scale >= 1 cannot overflow. Otherwise (a step to
  skip, sums that overflow, a scale below 1) the exact verdict decides, in
  a conditional whose other branch is empty, so XLA keeps it a conditional
  and runs it only then.
- The exact verdict is `max|g|` per gradient (NaN as +Inf: XLA's CPU max
  drops NaN), and per dtype the largest divided as every element is: all
  of `g / scale` is finite iff that quotient is, since rounding is
  monotonic.
- The scale passes an optimization barrier first: XLA turns a division by
  a constant (a fixed scale) into a multiplication by its reciprocal,
  which is 0 on a CPU at 2**127.
"""

from __future__ import annotations

import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from tf_lossscale import _tf_private
from tf_lossscale._numerics import (
    NARROW,
    add,
    all_of,
    divide,
    is_finite,
    rebuild,
)

__all__ = ["compiled_whole", "divides_where_used", "runtime_scale",
           "undivided", "unscale", "verdict"]


def compiled_whole(jit_compile: Optional[bool]) -> bool:
    """Whether the caller is compiled whole by XLA (and no back end forced)."""
    return jit_compile is None and _tf_private.in_xla_context()


def divides_where_used() -> bool:
    """Whether a step should divide inside its apply branch (see above).

    There a step checks the scaled gradients with `finite.check_unscaled`
    and divides them where the update uses them.
    """
    return compiled_whole(None)


def runtime_scale(scale: Any) -> tf.Tensor:
    """The scale as float32, opaque to XLA's constant folding."""
    return _tf_private.xla_opaque(tf.cast(scale, tf.float32))


def unscale(grads: List[Any], values: List[Optional[tf.Tensor]],
            scale: tf.Tensor, check: bool
            ) -> Tuple[List[Any], Optional[tf.Tensor]]:
    """`finite.unscale_and_check` (verdict only if `check`) under XLA.

    Each quotient is remembered (see `undivided`).
    """
    scale = runtime_scale(scale)
    unscaled = [g if v is None else rebuild(g, divide(v, scale, tf.math.divide))
                for g, v in zip(grads, values)]
    for g, u in zip(grads, unscaled):
        if isinstance(u, tf.Tensor):
            _remember_division(u, g, scale)
    present = [v for v in values if v is not None]
    return unscaled, (verdict(present, scale) if check else None)


def verdict(values: List[tf.Tensor], scale: Optional[tf.Tensor]
            ) -> tf.Tensor:
    """True iff every `divide(v, scale)` (every `v` if no scale) is finite."""
    wide = [v for v in values if v.dtype not in NARROW]
    probes = [is_finite(v) for v in values if v.dtype in NARROW]
    if wide:
        probes.append(tf.math.is_finite(
            add([tf.cast(tf.reduce_sum(v), tf.float32) for v in wide])))
    fast = all_of(probes)
    if scale is not None:
        fast = tf.logical_and(fast, scale >= 1.0)
    return tf.cond(fast, lambda: fast, lambda: _exact(values, scale))


def _exact(values: List[tf.Tensor], scale: Optional[tf.Tensor]
           ) -> tf.Tensor:
    """`verdict`, exactly: the largest quotient per dtype is finite."""
    by_dtype: Dict[tf.DType, List[tf.Tensor]] = {}
    for v in values:
        if v.shape.num_elements() == 0:
            continue
        inf = tf.constant(float("inf"), v.dtype)
        top = tf.reduce_max(tf.where(tf.math.is_nan(v), inf, tf.abs(v)))
        by_dtype.setdefault(v.dtype, []).append(top)
    checks = []
    for dtype, tops in by_dtype.items():
        # An empty tensor of unknown size reduces to -inf: count it as 0.
        top = tf.maximum(tf.reduce_max(tf.stack(tops)), tf.zeros([], dtype))
        if scale is not None:
            top = divide(top, scale, tf.math.divide)
        checks.append(tf.math.is_finite(top))
    return all_of(checks) if checks else tf.constant(True)


# id of each dense quotient `unscale` made -> (a weak reference to it, the
# gradient it divided, the scale); an entry goes when its quotient does.
_DIVIDED: Dict[int, Tuple[Any, Any, tf.Tensor]] = {}


def _remember_division(quotient: tf.Tensor, grad: Any,
                       scale: tf.Tensor) -> None:
    key = id(quotient)
    ref = weakref.ref(quotient, lambda _: _DIVIDED.pop(key, None))
    _DIVIDED[key] = (ref, grad, scale)


_IDENTITIES = ("Identity", "IdentityN")


def _division_of(grad: Any) -> Optional[Tuple[Any, tf.Tensor]]:
    # Through identities: tf_keras sums gradients over one replica with an
    # IdentityN, which changes no value.
    while isinstance(grad, tf.Tensor) and grad.op.type in _IDENTITIES:
        grad = grad.op.inputs[grad.value_index if grad.op.type ==
                              "IdentityN" else 0]
    entry = _DIVIDED.get(id(grad))
    if entry is None or entry[0]() is not grad:
        return None
    return entry[1], entry[2]


def undivided(grads: Sequence[Any]
              ) -> Optional[Tuple[List[Any], tf.Tensor]]:
    """`(scaled, scale)` if `grads` are quotients `unscale` made.

    When every gradient (None aside) is a dense quotient made by `unscale`
    with one scale (or an identity of one), in a caller compiled whole,
    returns what was divided
    and that scale: a step can then divide again inside its apply branch
    (the same operation, so the same values), where XLA fuses the division
    into the update, and the quotient made outside, unused, is never
    written (the documented flow, `get_unscaled_gradients` and then
    `apply_gradients`, costs what the Keras 3 flow does). Otherwise None.
    """
    if not compiled_whole(None):
        return None
    present = [g for g in grads if g is not None]
    known = [o for o in map(_division_of, present) if o is not None]
    if not present or len(known) != len(present):
        return None
    if len({id(scale) for _, scale in known}) != 1:
        return None
    divided = iter(scaled for scaled, _ in known)
    return ([None if g is None else next(divided) for g in grads],
            known[0][1])
