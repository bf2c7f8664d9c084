"""Argument checks shared by every public constructor.

Each raises `ValueError` naming the argument, echoing what was passed and
saying what is accepted. Bools are rejected where numbers are expected:
`True` is an `int` to Python but never a loss scale.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

__all__ = ["check_int", "check_real", "is_real"]

FLOAT32_MAX = float(np.finfo(np.float32).max)


def is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(
        value, (bool, np.bool_))


def check_real(
    name: str,
    value: object,
    *,
    minimum: float,
    inclusive: bool = True,
    maximum: float = FLOAT32_MAX,
) -> float:
    """Returns `value` as a float if it is a real number in range, else raises.

    The default `maximum` is the largest float32: a loss scale lives in a
    float32 variable, and a larger number would silently become inf there.
    """
    bound = f">= {minimum:g}" if inclusive else f"> {minimum:g}"
    accepted = f"a finite int or float {bound} and <= {maximum:g}"
    if not is_real(value):
        raise ValueError(
            f"{name} must be {accepted}; got {value!r} of type "
            f"{type(value).__name__}.")
    number = float(value)
    too_small = number < minimum if inclusive else number <= minimum
    if not math.isfinite(number) or too_small or number > maximum:
        raise ValueError(f"{name} must be {accepted}; got {value!r}.")
    return number


def check_int(name: str, value: object, *, minimum: int) -> int:
    """Returns `value` as an int if it is an integer >= `minimum`, else raises."""
    accepted = f"an int >= {minimum}"
    if not isinstance(value, numbers.Integral) or isinstance(
            value, (bool, np.bool_)):
        raise ValueError(
            f"{name} must be {accepted}; got {value!r} of type "
            f"{type(value).__name__}.")
    if value < minimum:
        raise ValueError(f"{name} must be {accepted}; got {value!r}.")
    return int(value)
