"""The check and the unscale inside a caller that XLA compiles whole.

Under `jit_compile=True` (Keras' default for `fit` on a GPU) XLA fuses
across the whole step, and what costs is what it must write out. Measured
in the optimized HLO of a compiled step (benchmarks/hlo_step.py):

- A division used by two kernels (the check and the update) is written out
  once for both (XLA does not repeat a division), and one computed before
  a conditional and used inside it is written out too. So the step checks
  the scaled gradients and divides them inside its apply branch, where the
  division fuses into the update and no unscaled gradient is written.
- A multiply XLA does repeat. Two kernels read each quotient of an Adam
  step (its two moments), so when every scale is a power of two (every
  default scale) the apply branch multiplies by the reciprocal, the same
  bits as dividing (`apply_unscaled`).
- XLA's CPU reductions read a gradient in place only when nothing is fused
  into them: `reduce_sum(g)` reads it once, while `max(|g|)` or
  `all(is_finite(g))` first write a temporary. So the verdict of a large
  gradient is its sum; a finite total proves every such gradient finite,
  and dividing a finite value by a scale >= 1 cannot overflow. A small
  gradient (below `_SUMMED_FROM` elements) is checked by
  `all(is_finite(g))`: its temporary stays in cache, and the sums cost
  more there (issue 32: a transformer of 35 gradients of at most 32768
  elements, compiled by XLA, stepped about 5% slower with a sum each than
  with `all(is_finite)` each; an MLP of 512 x 512 kernels about 2% faster).
  Otherwise (a step to skip, sums that overflow, a scale below 1) the
  exact verdict decides, in a conditional whose other branch is empty, so
  XLA keeps it a conditional and runs it only then.
- The exact verdict reads each gradient's largest magnitude bits (three
  traced ops for all the gradients of one size, stacked; XLA's CPU max
  drops NaN, an integer max does not): NaN bits lie above +Inf's, and all
  of `g / scale` is finite iff the largest magnitude's quotient is, since
  rounding is monotonic.
- The scale passes an optimization barrier first: XLA turns a division by
  a constant (a fixed scale) into a multiplication by its reciprocal,
  which is 0 on a CPU at 2**127.

What costs a first call is tracing: TensorFlow spends about 600 Python
calls creating each op, and a step is traced again for a smaller last
batch (and twice when its first call creates variables, as a model built
in its first step does; the inner optimizer's slots are made eagerly,
`eager_variables.py`). So
the verdict, with its exact branch, is a `tf.function` of the gradients
(`_traced_once`): a trace with the same gradient shapes reuses its graph,
and XLA inlines it as if it were written out (the same HLO). A division
or a multiply per gradient is not: passing a tensor to a `tf.function`
costs more to trace than the op itself.
"""

from __future__ import annotations

from typing import (
    Any,
    Callable,
    Dict,
    List,
    Optional,
    Tuple,
)

import tensorflow as tf

from tf_lossscale import _tf_private
from tf_lossscale._numerics import (
    NARROW,
    add,
    all_axes,
    all_of,
    dense_values,
    divide,
    is_finite,
    multiply,
    rebuild,
)

__all__ = ["KIND_INF", "KIND_NAN", "apply_unscaled", "compiled_whole",
           "runtime_scale", "unscale", "verdict"]


def compiled_whole() -> bool:
    """Whether the code being traced is compiled whole by XLA.

    The one place that asks; `finite.compile_mode` turns the answer into
    the `Mode` a step hands to whoever needs it.
    """
    return _tf_private.in_xla_context()


def runtime_scale(scale: Any) -> tf.Tensor:
    """The scale as float32, opaque to XLA's constant folding."""
    return _tf_private.xla_opaque(tf.cast(scale, tf.float32))


def unscale(grads: List[Any], values: List[Optional[tf.Tensor]],
            scale: tf.Tensor, check: bool
            ) -> Tuple[List[Any], Optional[Tuple[tf.Tensor, tf.Tensor]]]:
    """`finite.unscale_and_check` under XLA: the quotients, and with
    `check` the verdict and kinds of the present values (`verdict`)."""
    scale = runtime_scale(scale)
    unscaled = [g if v is None else rebuild(g, divide(v, scale, tf.math.divide))
                for g, v in zip(grads, values)]
    present = [v for v in values if v is not None]
    return unscaled, (verdict(present, scale) if check else None)


def _traced_once(fn: Callable[..., Any]) -> Any:
    """`fn`, a pure function of tensors, as a `tf.function` that a caller
    traced again with the same shapes calls instead of tracing it again."""
    return tf.function(fn, autograph=False)


def apply_unscaled(apply: Callable[[List[Any]], Any], grads: List[Any],
                   scale: Any, by_reciprocal: bool) -> None:
    """Runs `apply` on the gradients unscaled (None kept), inside the apply
    branch, so the unscale fuses into the update.

    XLA writes out a division that two kernels read (Adam's moments: 4
    bytes per parameter written and read back, a fifth of an Adam step on
    a CPU) but repeats a multiply. So when every scale the step can see is
    a power of two (`by_reciprocal`: `state_machine.powers_of_two_only`),
    the gradients are multiplied by its reciprocal, in two normal factors
    (`_reciprocal_factors`): the same bits as the division, at every power
    of two from 2**-126 to 2**127. Otherwise they are divided. One way is
    traced, not both: a second copy of the update would double what the
    first call compiles.
    """
    scale = runtime_scale(scale)
    if by_reciprocal:
        factors = _reciprocal_factors(scale)

        def unscale(v: tf.Tensor) -> tf.Tensor:
            return multiply(v, *factors)
    else:
        def unscale(v: tf.Tensor) -> tf.Tensor:
            return divide(v, scale, tf.math.divide)
    apply([g if v is None else rebuild(g, unscale(v))
           for g, v in zip(grads, map(dense_values, grads))])


_HUGE = 2.0**126  # the largest power of two with a normal reciprocal


def _reciprocal_factors(scale: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
    """Two float32 factors: multiplying by one and then the other divides
    by a power-of-two `scale` exactly.

    `(1 / scale, 1)` up to 2**126; above, `1 / scale` is subnormal (a CPU
    flushes it to 0), so `(2**-64, 2**64 / scale)`: the first product is
    normal, hence exact, unless the quotient rounds to 0 either way. For
    another scale it is the reciprocal's rounding, as the originals unscale.
    """
    huge = scale > _HUGE
    first = tf.where(huge, tf.constant(2.0**-64), 1.0 / scale)
    second = tf.where(huge, 2.0**64 / scale, tf.constant(1.0))
    return first, second


def verdict(values: List[tf.Tensor], scale: Optional[tf.Tensor]
            ) -> Tuple[tf.Tensor, tf.Tensor]:
    """Whether every `divide(v, scale)` (every `v` if no scale) is finite,
    and each value's kind.

    The kinds (int32, one per value) are 0 where `v / scale` is all
    finite, `KIND_NAN` where `v` holds a NaN, `KIND_INF` where it holds an
    Inf or its quotient overflows; all zeros when the check passed without
    its exact branch. A skipped step's record reads them instead of reading
    every gradient again.
    """
    return _checked(list(values), scale)


# From this many elements a float32 or float64 value is checked by its sum
# (read in place); below, by `all(is_finite)`. Between the measured sizes
# (module docstring): 32768 elements were faster with `all(is_finite)`,
# 262144 with the sum. The price: about 0.9 s more of the transformer's
# first call under XLA on tf_keras, none measurable on Keras 3; one check
# per dtype over the small values concatenated cost no first call but gave
# the per-step gain back (measured on 2026-12-02, issue 32).
_SUMMED_FROM = 2**16


def _summed(value: tf.Tensor) -> bool:
    """Whether the fast check reads `value` through its sum: a wide float
    (a float16 sum would overflow) that is large, or of unknown size."""
    size = value.shape.num_elements()
    return value.dtype not in NARROW and (size is None
                                          or size >= _SUMMED_FROM)


@_traced_once
def _checked(values: List[tf.Tensor], scale: Optional[tf.Tensor]
             ) -> Tuple[tf.Tensor, tf.Tensor]:
    """`verdict` and the kinds: one sum per large value, `all(is_finite)`
    per other, and `_exact` only if one is not finite (or the scale is
    below 1)."""
    axes: Dict[int, tf.Tensor] = {}
    wide = [v for v in values if _summed(v)]
    probes = [is_finite(v) for v in values if not _summed(v)]
    if wide:
        probes.append(tf.math.is_finite(add(
            [tf.cast(tf.reduce_sum(v, all_axes(v, axes)), tf.float32)
             for v in wide])))
    fast = all_of(probes)
    if scale is not None:
        fast = tf.logical_and(fast, scale >= 1.0)
    return tf.cond(
        fast, lambda: (fast, tf.zeros([len(values)], tf.int32)),
        lambda: _exact(values, scale))


def _exact(values: List[tf.Tensor], scale: Optional[tf.Tensor]
           ) -> Tuple[tf.Tensor, tf.Tensor]:
    """`verdict`, exactly, and each value's kind (see `kinds_of`).

    Every value is flattened first, all of them in order: that keeps the
    order of this conditional's operands, which the schedule of the whole
    compiled step follows (reordered, a `fit` step measured 2% slower).
    Then per dtype, the values of one size are stacked and reduced
    together (`_kinds_by_bits`). Only a step whose fast check failed runs
    it; what it costs every run is compiling it.
    """
    flat = tf.constant([-1])
    flats = [tf.reshape(v, flat) for v in values]
    groups: Dict[tf.DType, List[int]] = {}
    for i, v in enumerate(flats):
        groups.setdefault(v.dtype.base_dtype, []).append(i)
    parts, order = [], []
    for dtype, members in groups.items():
        parts.append(_kinds_by_bits([flats[i] for i in members], dtype,
                                    scale))
        order += members
    kinds = _in_order(parts, order)
    return tf.reduce_all(tf.equal(kinds, 0)), kinds


def _in_order(parts: List[tf.Tensor], order: List[int]) -> tf.Tensor:
    """`parts` joined, then put back in the values' order (`order[k]`: the
    value whose result is the k-th element joined)."""
    joined = parts[0] if len(parts) == 1 else tf.concat(parts, 0)
    if order == sorted(order):
        return joined
    position = [0] * len(order)
    for at, i in enumerate(order):
        position[i] = at
    return tf.gather(joined, position)


# Per float dtype: the integer of its width, the mask that drops the sign,
# and +Inf's bits. Magnitudes' bits order as the magnitudes do, and every
# NaN's lie above +Inf's.
_BITS = {tf.float16: (tf.int16, 0x7FFF, 0x7C00),
         tf.bfloat16: (tf.int16, 0x7FFF, 0x7F80),
         tf.float32: (tf.int32, 0x7FFFFFFF, 0x7F800000),
         tf.float64: (tf.int64, 0x7FFFFFFFFFFFFFFF, 0x7FF0000000000000)}


def _kinds_by_bits(values: List[tf.Tensor], dtype: tf.DType,
                   scale: Optional[tf.Tensor]) -> tf.Tensor:
    """Each value's kind (int32), for flat values of one float `dtype`.

    The largest bits of each value's magnitudes: bits above +Inf's are a
    NaN; else every quotient is finite iff the largest magnitude's is,
    since rounding is monotonic. The values of one size are stacked and
    reduced in one kernel: one reduction per value compiled into about
    three kernels each (the transformer of
    benchmarks/workload_transformer.py: 105 fusions in this branch, 28
    stacked, the rest of the step unchanged); compiling them cost up to
    about a second of a first call.
    """
    integer, mask, inf = _BITS[dtype]
    shared_mask = tf.constant(mask, integer)

    def largest(stacked: tf.Tensor) -> tf.Tensor:
        # An empty value's largest is the least integer: the bits of -0.0.
        return tf.reduce_max(tf.bitwise.bitwise_and(
            tf.bitcast(stacked, integer), shared_mask), 1)

    sizes: Dict[Optional[int], List[int]] = {}
    for i, v in enumerate(values):
        sizes.setdefault(v.shape.num_elements(), []).append(i)
    parts, order = [], []
    for size, members in sizes.items():
        if size is None:  # unknown sizes do not stack: one at a time
            parts += [largest(values[i][tf.newaxis]) for i in members]
        else:
            parts.append(largest(tf.stack([values[i] for i in members])))
        order += members
    top = _in_order(parts, order)
    biggest = tf.bitcast(top, dtype)
    quotient = biggest if scale is None else divide(
        biggest, scale, tf.math.divide)
    return tf.where(top > inf, _NAN, tf.where(
        tf.math.is_finite(quotient), 0, _INF))


# Kinds: 0 finite, 1 holds a NaN, 2 holds an Inf (or its quotient
# overflows) and no NaN.
KIND_NAN, KIND_INF = 1, 2
_NAN, _INF = KIND_NAN, KIND_INF
