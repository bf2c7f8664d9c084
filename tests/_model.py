"""A plain-Python model of TensorFlow's dynamic loss-scale rule, for tests.

It shares no code with `tf_lossscale`: tests compare the library against it.
The scale is kept as a `numpy.float32` and every product and quotient is
rounded to float32, exactly as the float32 TF variable does, so a model run
and a TF run agree bit for bit (also near the float32 maximum and for
multipliers that float32 cannot represent, such as 1.1).

    >>> model = PythonLossScale(initial=4, period=2, multiplier=2)
    >>> model.step(True), model.step(True), model.step(False)
    ((4.0, 1), (8.0, 0), (4.0, 0))
    >>> trajectory([True, True, False], initial=4, period=2, multiplier=2)
    [(4.0, 1), (8.0, 0), (4.0, 0)]
"""

from __future__ import annotations

from typing import Iterable, List, Tuple

import numpy as np

__all__ = ["PythonLossScale", "trajectory"]

State = Tuple[float, int]


class PythonLossScale:
    """TensorFlow's `DynamicLossScale` rule in plain Python.

    Attributes:
      scale: the current loss scale, a `numpy.float32`.
      good_steps: consecutive finite steps counted so far, an int.
    """

    def __init__(self, initial: float, period: int,
                 multiplier: float) -> None:
        self.scale = np.float32(initial)
        self.good_steps = 0
        self.period = int(period)
        self.multiplier = np.float32(multiplier)

    def step(self, finite: bool) -> State:
        """Applies one step and returns the new `(scale, good_steps)`.

        `scale` is returned as a Python float holding the float32 value.
        """
        with np.errstate(over="ignore"):
            if not finite:
                self.scale = max(self.scale / self.multiplier, np.float32(1))
                self.good_steps = 0
            elif self.good_steps + 1 >= self.period:
                grown = self.scale * self.multiplier
                if np.isfinite(grown):
                    self.scale = grown
                self.good_steps = 0
            else:
                self.good_steps += 1
        return self.state

    @property
    def state(self) -> State:
        return float(self.scale), self.good_steps


def trajectory(flags: Iterable[bool], *, initial: float, period: int,
               multiplier: float) -> List[State]:
    """The `(scale, good_steps)` after each step of `flags` (True = finite)."""
    model = PythonLossScale(initial, period, multiplier)
    return [model.step(flag) for flag in flags]
