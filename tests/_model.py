"""A plain-Python model of the dynamic loss-scale rule, for tests.

It shares no code with `tf_lossscale`: tests compare the library against it.
The scale is kept as a `numpy.float32` and every product and quotient is
rounded to float32, exactly as the float32 TF variable does, so a model run
and a TF run agree bit for bit (also near the float32 maximum and for
multipliers that float32 cannot represent, such as 1.1).

Without knobs it is TensorFlow's `DynamicLossScale`: one `multiplier` grows
and (dividing) backs off, the floor is 1, growth stops short of inf. The
keyword-only knobs are those of `LossScaleOptimizer` (docs/scaling-policy.md):

- `growth_factor`: multiplies on a growth (default: `multiplier`);
- `backoff_factor`: multiplies on a back-off (default: none, and a back-off
  divides by `multiplier`, as TensorFlow's class does);
- `min_scale`: the floor of a back-off (default 1);
- `max_scale`: a growth happens only if its result is <= this (default: the
  largest float32);
- `hysteresis`: a back-off happens only once this many non-finite steps
  have been counted since the last growth step (a finite step that reaches
  the period, whether the scale grew or was capped); the count is not reset
  by a back-off.

    >>> model = PythonLossScale(initial=4, period=2, multiplier=2)
    >>> model.step(True), model.step(True), model.step(False)
    ((4.0, 1), (8.0, 0), (4.0, 0))
    >>> trajectory([True, True, False], initial=4, period=2, multiplier=2)
    [(4.0, 1), (8.0, 0), (4.0, 0)]
    >>> model = PythonLossScale(8, 2, growth_factor=4, backoff_factor=0.25,
    ...                         min_scale=0.5, max_scale=16, hysteresis=2)
    >>> [model.step(f) for f in (False, False, False, True, True)]
    [(8.0, 0), (2.0, 0), (0.5, 0), (0.5, 1), (2.0, 0)]
    >>> model.bad_steps, model.step(True), model.step(True), model.step(False)
    (0, (2.0, 1), (8.0, 0), (8.0, 0))
"""

from __future__ import annotations

from typing import Iterable, List, Optional, Tuple

import numpy as np

__all__ = ["PythonLossScale", "trajectory"]

State = Tuple[float, int]

_F32_MAX = np.finfo(np.float32).max


class PythonLossScale:
    """The dynamic loss-scale rule, with the optimizers' knobs, in Python.

    Attributes:
      scale: the current loss scale, a `numpy.float32`.
      good_steps: consecutive finite steps counted so far, an int.
      bad_steps: non-finite steps since the last growth step, an int.
    """

    def __init__(self, initial: float, period: int, multiplier: float = 2.0,
                 *, growth_factor: Optional[float] = None,
                 backoff_factor: Optional[float] = None,
                 min_scale: float = 1.0, max_scale: Optional[float] = None,
                 hysteresis: int = 1) -> None:
        self.scale = np.float32(initial)
        self.good_steps = 0
        self.bad_steps = 0
        self.period = int(period)
        self.multiplier = np.float32(multiplier)
        self.growth_factor = np.float32(
            multiplier if growth_factor is None else growth_factor)
        self.backoff_factor = (None if backoff_factor is None
                               else np.float32(backoff_factor))
        self.min_scale = np.float32(min_scale)
        self.max_scale = (_F32_MAX if max_scale is None
                          else np.float32(max_scale))
        self.hysteresis = int(hysteresis)

    def _lowered(self) -> np.float32:
        if self.backoff_factor is None:
            return self.scale / self.multiplier
        return self.scale * self.backoff_factor

    def step(self, finite: bool) -> State:
        """Applies one step and returns the new `(scale, good_steps)`.

        `scale` is returned as a Python float holding the float32 value.
        """
        with np.errstate(over="ignore", under="ignore"):
            if not finite:
                self.bad_steps += 1
                if self.bad_steps >= self.hysteresis:
                    self.scale = max(self._lowered(), self.min_scale)
                self.good_steps = 0
            elif self.good_steps + 1 >= self.period:
                grown = self.scale * self.growth_factor
                if grown <= self.max_scale:  # False for inf.
                    self.scale = grown
                self.good_steps = 0
                self.bad_steps = 0
            else:
                self.good_steps += 1
        return self.state

    @property
    def state(self) -> State:
        return float(self.scale), self.good_steps


def trajectory(flags: Iterable[bool], *, initial: float, period: int,
               multiplier: float = 2.0, **knobs: float) -> List[State]:
    """The `(scale, good_steps)` after each step of `flags` (True = finite)."""
    model = PythonLossScale(initial, period, multiplier, **knobs)
    return [model.step(flag) for flag in flags]
