"""The dynamic loss-scale transition rule, as one pure function.

Every wrapper in this package (`DynamicLossScale`, both Keras optimizer
flavours, the TF1 optimizer) keeps its state in variables and calls
`next_state` to compute the next one; none writes the rule again.

Glossary (the public API keeps TensorFlow's names, the code uses these):

==============  ======================  ============================
here            `DynamicLossScale`      Keras `LossScaleOptimizer`
==============  ======================  ============================
scale           current loss scale      `loss_scale`
good_steps      `good_steps`            `dynamic_counter`
period          `increment_period`      `dynamic_growth_steps`
multiplier      `multiplier`            (always 2)
==============  ======================  ============================

The rule, for one step whose gradients are `finite` (all of them) or not::

    if finite:
        if good_steps + 1 >= period:
            scale = scale * multiplier  if that product is finite, else scale
            good_steps = 0
        else:
            good_steps += 1
    else:
        scale = max(scale / multiplier, min_scale)
        good_steps = 0
"""

from __future__ import annotations

from typing import Tuple, Union

import tensorflow as tf

__all__ = ["next_state"]

TensorLike = Union[tf.Tensor, tf.Variable, float, int, bool]


def next_state(
    scale: TensorLike,
    good_steps: TensorLike,
    finite: TensorLike,
    *,
    period: TensorLike,
    multiplier: TensorLike,
    min_scale: float = 1.0,
) -> Tuple[tf.Tensor, tf.Tensor]:
    """Returns the `(scale, good_steps)` that follow one step.

    Branch-free (`tf.where`, no `tf.cond`), so it costs a handful of scalar
    ops, traces to the same graph eagerly, in `tf.function`, in TF1 graphs
    and under XLA, and never places a variable read inside a branch.

    Args:
      scale: current loss scale, a float32 scalar.
      good_steps: consecutive finite steps so far, an int64 scalar.
      finite: whether every gradient of this step is finite, a bool scalar.
      period: finite steps after which the scale grows (>= 1).
      multiplier: growth and back-off factor (> 1).
      min_scale: the back-off floor.

    Returns:
      The new `(scale, good_steps)` as float32 and int64 scalar tensors.
    """
    scale = tf.convert_to_tensor(scale, tf.float32)
    good_steps = tf.convert_to_tensor(good_steps, tf.int64)
    finite = tf.convert_to_tensor(finite, tf.bool)
    multiplier = tf.cast(multiplier, tf.float32)

    counted = good_steps + 1
    grow = tf.logical_and(finite, counted >= tf.cast(period, tf.int64))
    grown = scale * multiplier
    grown = tf.where(tf.math.is_finite(grown), grown, scale)
    backed_off = tf.maximum(scale / multiplier, tf.cast(min_scale, tf.float32))

    new_scale = tf.where(finite, tf.where(grow, grown, scale), backed_off)
    keep_counting = tf.logical_and(finite, tf.logical_not(grow))
    new_good_steps = tf.where(
        keep_counting, counted, tf.zeros_like(counted))
    return new_scale, new_good_steps
