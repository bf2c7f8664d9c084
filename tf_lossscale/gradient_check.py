"""`check_gradients`: each gradient must fit its variable before a step."""

from __future__ import annotations

from typing import Any, Sequence

import tensorflow as tf

__all__ = ["check_gradients", "variable_name"]


def variable_name(variable: Any) -> str:
    """Keras 3's path, or a tf.Variable's name without its ':0' output index."""
    return getattr(variable, "path", None) or variable.name.rsplit(":", 1)[0]


def _shape_text(shape: tf.TensorShape) -> str:
    return str(tuple(shape.as_list())) if shape.rank is not None else "?"


def check_gradients(grads: Sequence[Any], variables: Sequence[Any]) -> None:
    """Raises unless each gradient fits its variable (None is allowed).

    A gradient must be floating point (the unscale would turn an integer
    one into zeros) and have the variable's shape (for `tf.IndexedSlices`,
    its rows must).

    Raises:
      TypeError: a gradient is not floating point.
      ValueError: a gradient's shape does not fit its variable's.
    """
    for grad, variable in zip(grads, variables):
        if grad is None:
            continue
        values = grad.values if isinstance(grad, tf.IndexedSlices) else grad
        dtype = tf.as_dtype(values.dtype)
        name = variable_name(variable)
        if not dtype.is_floating:
            raise TypeError(
                f"The gradient for variable {name!r} has dtype {dtype.name}; "
                "gradients must be floating point (float16, bfloat16, "
                "float32 or float64).")
        shape = tf.TensorShape(values.shape)
        expected = tf.TensorShape(variable.shape)
        if isinstance(grad, tf.IndexedSlices):
            shape, expected = shape[1:], expected[1:]
        if not shape.is_compatible_with(expected):
            raise ValueError(
                f"The gradient for variable {name!r} has shape "
                f"{_shape_text(shape)}, which does not fit the variable's "
                f"shape {_shape_text(expected)}.")

