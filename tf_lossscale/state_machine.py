"""The dynamic loss-scale rule and its defaults: one pure function, one module.

Every wrapper in this package (`DynamicLossScale`, every Keras optimizer
flavour, the TF1 optimizer) keeps its state in variables and calls
`transition` (through `step.advance`) to compute the next one; none writes the
rule or a default again.

Glossary (the public API keeps TensorFlow's names, the code uses these):

==============  ======================  ============================
here            `DynamicLossScale`      Keras `LossScaleOptimizer`
==============  ======================  ============================
scale           current loss scale      `loss_scale`
good_steps      `good_steps`            `dynamic_counter`
period          `increment_period`      `dynamic_growth_steps`
growth_factor   `multiplier`            `growth_factor` (2)
backoff         divide by `multiplier`  times `backoff_factor` (0.5)
bad_steps       (none)                  non-finite steps since the last
                                        growth (only with `hysteresis`)
==============  ======================  ============================

The rule, for one step whose gradients are `finite` (all of them) or not::

    if finite:
        if good_steps + 1 >= period:          # a growth step
            if scale * growth_factor <= max_scale:   # also: is finite
                scale = scale * growth_factor
            good_steps = 0; bad_steps = 0
        else:
            good_steps += 1
    else:
        bad_steps += 1
        if bad_steps >= hysteresis:
            scale = max(backed_off(scale), min_scale)
        good_steps = 0

where `backed_off(scale)` is `scale * backoff_factor` when the rule has a
`backoff_factor` (the optimizers' knob, a multiplier as in PyTorch's
`GradScaler`) and `scale / backoff_divisor` otherwise (TensorFlow's
`DynamicLossScale`, which divides by its multiplier). Every number is a
float32 and every product and quotient is rounded to float32; the counters
are int64. `bad_steps` counts the non-finite steps since the last growth
step (a finite step that reaches `period`, grown or capped): it is not reset
by a back-off, so once `hysteresis` is reached every further non-finite step
backs off until the next growth step (Megatron-LM's rule).

With the defaults (`hysteresis=1`, `max_scale` the largest float32,
`min_scale=1`, growth by 2 and back-off by half) this is exactly
TensorFlow's `DynamicLossScale`: halving multiplies by 0.5 or divides by 2,
which round alike.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple, Optional, Tuple, Union

import tensorflow as tf

from tf_lossscale._checks import FLOAT32_MAX

__all__ = [
    "DEFAULT_GROWTH_STEPS",
    "DEFAULT_INITIAL_SCALE",
    "DEFAULT_MULTIPLIER",
    "FLOAT32_MAX",
    "Rule",
    "State",
    "next_state",
    "powers_of_two_only",
    "transition",
]

# TensorFlow's defaults, for both `DynamicLossScale` and the optimizers.
DEFAULT_INITIAL_SCALE = 2.0**15
DEFAULT_GROWTH_STEPS = 2000
DEFAULT_MULTIPLIER = 2.0

TensorLike = Union[tf.Tensor, tf.Variable, float, int, bool]


@dataclasses.dataclass(frozen=True)
class Rule:
    """The constants of the rule (checked by the callers' constructors).

    Python numbers in the wrappers; scalar tensors are accepted too (tests
    trace the rule with tensor constants).

    A back-off multiplies by `backoff_factor` when it is set (the
    optimizers' knob: `backoff_factor=0.3` means `scale * float32(0.3)`, not
    a division by the float32 rounding of 1 / 0.3), and divides by
    `backoff_divisor` otherwise (as TensorFlow divides by its multiplier, so
    a multiplier that float32 cannot invert exactly, such as 3, backs off
    exactly as TensorFlow's class does). `max_scale=None` means the largest
    float32, which lets the scale grow to any finite value.
    """

    period: TensorLike = DEFAULT_GROWTH_STEPS
    growth_factor: TensorLike = DEFAULT_MULTIPLIER
    backoff_divisor: TensorLike = DEFAULT_MULTIPLIER
    min_scale: TensorLike = 1.0
    max_scale: Optional[TensorLike] = None
    hysteresis: TensorLike = 1
    backoff_factor: Optional[TensorLike] = None

    @property
    def needs_bad_steps(self) -> bool:
        """Whether the state must keep `bad_steps` (only with hysteresis)."""
        return not (isinstance(self.hysteresis, int) and self.hysteresis == 1)


class State(NamedTuple):
    """The variables' values: float32 scale, int64 counters."""

    scale: TensorLike
    good_steps: TensorLike
    bad_steps: TensorLike = 0


def transition(state: State, finite: TensorLike, rule: Rule) -> State:
    """Returns the `State` that follows one step (the module docstring's rule).

    Branch-free (`tf.where`, no `tf.cond`), so it costs a handful of scalar
    ops, traces to the same graph eagerly, in `tf.function`, in TF1 graphs
    and under XLA, and never places a variable read inside a branch.
    """
    scale = tf.convert_to_tensor(state.scale, tf.float32)
    good = tf.convert_to_tensor(state.good_steps, tf.int64)
    bad = tf.convert_to_tensor(state.bad_steps, tf.int64)
    finite = tf.convert_to_tensor(finite, tf.bool)
    max_scale = FLOAT32_MAX if rule.max_scale is None else rule.max_scale

    counted = good + 1
    grow = tf.logical_and(finite, counted >= tf.cast(rule.period, tf.int64))
    grown = scale * tf.cast(rule.growth_factor, tf.float32)
    # `<=` is False for inf and NaN, so a growth never leaves float32.
    grown = tf.where(grown <= tf.cast(max_scale, tf.float32), grown, scale)
    new_bad = tf.where(finite, tf.where(grow, tf.zeros_like(bad), bad),
                       bad + 1)
    if rule.backoff_factor is None:
        lowered = scale / tf.cast(rule.backoff_divisor, tf.float32)
    else:
        lowered = scale * tf.cast(rule.backoff_factor, tf.float32)
    backed_off = tf.maximum(lowered, tf.cast(rule.min_scale, tf.float32))
    backs_off = new_bad >= tf.cast(rule.hysteresis, tf.int64)
    new_scale = tf.where(
        finite, tf.where(grow, grown, scale),
        tf.where(backs_off, backed_off, scale))
    keep_counting = tf.logical_and(finite, tf.logical_not(grow))
    new_good = tf.where(keep_counting, counted, tf.zeros_like(counted))
    return State(new_scale, new_good, new_bad)


def next_state(
    scale: TensorLike,
    good_steps: TensorLike,
    finite: TensorLike,
    *,
    period: TensorLike,
    multiplier: TensorLike,
    min_scale: float = 1.0,
) -> Tuple[tf.Tensor, tf.Tensor]:
    """TensorFlow's rule: `transition` with one multiplier and no hysteresis.

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
    rule = Rule(period=period, growth_factor=multiplier,
                backoff_divisor=multiplier, min_scale=min_scale)
    new = transition(State(scale, good_steps), finite, rule)
    return new.scale, new.good_steps


def powers_of_two_only(rule: Optional[Rule], start: TensorLike) -> bool:
    """Whether every scale `rule` reaches from `start` is a power of two
    (`rule=None`: a fixed scale, `start` only).

    So it is when `start` and every factor and bound are: products and
    quotients of powers of two are exact, a growth past the largest float32
    is not taken, and a back-off floors at `min_scale` (at least 2**-126).
    Tensors are not looked into: False.
    """
    numbers = [start]
    if rule is not None:
        numbers += [rule.growth_factor, rule.min_scale,
                    rule.backoff_divisor if rule.backoff_factor is None
                    else rule.backoff_factor]
        if rule.max_scale is not None:
            numbers.append(rule.max_scale)
    return all(_power_of_two(x) for x in numbers)


def _power_of_two(x: TensorLike) -> bool:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    if not (math.isfinite(x) and x > 0):
        return False
    return math.frexp(x)[0] == 0.5
