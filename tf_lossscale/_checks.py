"""Argument checks shared by every public constructor.

Each raises `ValueError` naming the argument, echoing what was passed and
saying what is accepted. Bools are rejected where numbers are expected:
`True` is an `int` to Python but never a loss scale.

Loss-scale numbers end up in float32 variables and the step counter in an
int64 one, so a number is checked as that storage will hold it: 1 + 1e-9 is
no multiplier > 1 once it is a float32, 1e-50 no scale > 0, and 2**63 no
int64.

A number may also come as a scalar: a 0-d NumPy array, or an eager scalar
tensor or variable (`tf.constant(1024.0)`), as TensorFlow's and Keras'
constructors take them; it is checked as the Python number it holds.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np
import tensorflow as tf

__all__ = ["FLOAT32_MAX", "INT64_MAX", "NotANumberError", "as_python_scalar",
           "check_int",
           "check_real", "is_real"]

FLOAT32_MAX = float(np.finfo(np.float32).max)
INT64_MAX = int(np.iinfo(np.int64).max)


class NotANumberError(ValueError, TypeError):
    """A number argument got something that is no number (None, a list...).

    A ValueError, as every bad argument of this package, and a TypeError,
    as the originals raise there (`float(None)` inside TensorFlow's and
    tf_keras' constructors).
    """

    # AutoGraph re-raises an exception from converted code with its own
    # type only if its `__init__` is `Exception.__init__` (or the type is
    # one of a few builtins); else a `tf.function` caller gets StagingError.
    __init__ = Exception.__init__


def as_python_scalar(value: object) -> object:
    """A 0-d array, or an eager scalar tensor or variable, as its Python
    number; anything else as it is (the checks then judge it)."""
    if isinstance(value, np.ndarray) and value.shape == ():
        return value.item()
    tensor: Any = value
    if (tf.is_tensor(tensor) or isinstance(tensor, tf.Variable)) and (
            tensor.shape.rank == 0 and hasattr(tensor, "numpy")):
        try:
            return tensor.numpy().item()
        except (AttributeError, NotImplementedError, TypeError,
                ValueError):  # a symbolic tensor has no value yet
            return value
    return value


def is_real(value: object) -> bool:
    """True for Python and NumPy ints and floats, False for bools."""
    return isinstance(value, numbers.Real) and not isinstance(
        value, (bool, np.bool_))


def _in_range(number: float, minimum: float, inclusive: bool,
              maximum: float) -> bool:
    above = number >= minimum if inclusive else number > minimum
    return above and number <= maximum


def check_real(
    name: str,
    value: object,
    *,
    minimum: float,
    inclusive: bool = True,
    maximum: float = FLOAT32_MAX,
) -> float:
    """Returns `value` as a float if it is a real number in range, else raises.

    The range must hold for the number and for its float32 rounding. The
    default `maximum` is the largest float32: a loss scale lives in a float32
    variable, and a larger number would silently become inf there.
    """
    value = as_python_scalar(value)
    bound = f">= {minimum:g}" if inclusive else f"> {minimum:g}"
    limit = " (the float32 maximum)" if maximum == FLOAT32_MAX else ""
    accepted = f"a finite int or float {bound} and <= {maximum!r}{limit}"
    if not is_real(value):
        raise NotANumberError(
            f"{name} must be {accepted}; got {value!r} of type "
            f"{type(value).__name__}.")
    number = float(value)  # type: ignore[arg-type]  # is_real said so
    if not math.isfinite(number) or not _in_range(
            number, minimum, inclusive, maximum):
        raise ValueError(f"{name} must be {accepted}; got {value!r}.")
    as_float32 = float(np.float32(number))
    if not _in_range(as_float32, minimum, inclusive, maximum):
        raise ValueError(
            f"{name} must be {accepted} as a float32 (its storage); got "
            f"{value!r}, which is {as_float32!r} there.")
    return number


def check_int(name: str, value: object, *, minimum: int,
              maximum: int = INT64_MAX) -> int:
    """Returns `value` as an int if it is an integer in range, else raises.

    An integral float (`2000.0`) is accepted, as TensorFlow and Keras accept
    it; a fractional one is not. The default `maximum` is the largest int64,
    the counter's storage.
    """
    upper = " and < 2**63" if maximum == INT64_MAX else f" and <= {maximum}"
    accepted = f"an int >= {minimum}{upper} (or an integral float)"
    value = as_python_scalar(value)
    if isinstance(value, (float, np.floating)) and math.isfinite(value) and (
            float(value).is_integer()):
        value = int(value)
    if not isinstance(value, numbers.Real) or isinstance(
            value, (bool, np.bool_)):
        raise NotANumberError(
            f"{name} must be {accepted}; got {value!r} of type "
            f"{type(value).__name__}.")
    if not isinstance(value, numbers.Integral):
        raise ValueError(
            f"{name} must be {accepted}; got {value!r} of type "
            f"{type(value).__name__}.")
    integer = int(value)
    if not minimum <= integer <= maximum:
        raise ValueError(f"{name} must be {accepted}; got {value!r}.")
    return integer

