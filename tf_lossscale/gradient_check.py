"""Checks of a step's inputs, made before anything changes.

`check_gradients`: each gradient must fit its variable; `check_variables`:
what is trained must be variables; `check_loss`: a loss must exist;
`checked_sparse_rows`: sparse gradients must index their variable's rows.
Each raises an exception that is both this package's `ValueError` and the
type the originals raise in the same place (they raise it later, from
inside, often after part of the step was applied).
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import tensorflow as tf

__all__ = [
    "GradientShapeError", "LossIsNoneError", "NotAVariableError",
    "check_gradients", "check_loss", "check_variables",
    "checked_sparse_rows", "variable_name"]


def variable_name(variable: Any) -> str:
    """Keras 3's path, or a tf.Variable's name without its ':0' output index."""
    return getattr(variable, "path", None) or variable.name.rsplit(":", 1)[0]


class GradientShapeError(ValueError, tf.errors.InvalidArgumentError):
    """A gradient whose shape does not fit its variable.

    A ValueError, as this package raises for bad input and as TensorFlow
    raises while tracing, and an `InvalidArgumentError`, as the originals
    raise when they run the update eagerly, so code written against either
    catches it.
    """

    # AutoGraph re-raises an exception from converted code with its own
    # type only if its `__init__` is `Exception.__init__` (see
    # `distribute.ReplicaContextError`); the `OpError` fields are then
    # class attributes and the message is the exception's argument.
    __init__ = Exception.__init__
    _node_def = None
    _op = None
    _error_code = tf.errors.INVALID_ARGUMENT
    _experimental_payloads: dict = {}

    @property
    def _message(self) -> str:
        return str(self.args[0]) if self.args else ""

    def __str__(self) -> str:
        return self._message

    def __reduce__(self) -> Any:
        return type(self), self.args


class LossIsNoneError(ValueError, AttributeError):
    """The loss (or what the loss callable returned) is None.

    A ValueError, as this package raises for bad input, and an
    AttributeError, as TensorFlow's and tf_keras' wrappers raise when they
    read the dtype of None.
    """

    __init__ = Exception.__init__  # Rebuildable by AutoGraph (see above).


class NotAVariableError(ValueError, NotImplementedError, AttributeError):
    """Something to train is a tensor (or anything else), not a variable.

    A ValueError, as TensorFlow's `minimize` raises; a NotImplementedError,
    as tf_keras' legacy optimizers and TensorFlow's TF1 optimizer raise
    ("Trying to update a Tensor"); an AttributeError, as tf_keras' current
    optimizers raise (a tensor has no `_unique_id`). Code written against
    any of them catches it.
    """

    __init__ = Exception.__init__  # Rebuildable by AutoGraph (see above).


def check_loss(loss: Any) -> None:
    """Raises `LossIsNoneError` if `loss` is None."""
    if loss is None:
        raise LossIsNoneError(
            "The loss is None: pass a loss tensor, or a callable that "
            "returns one (a loss function that forgot its `return` gives "
            "None).")


def check_variables(variables: Sequence[Any]) -> None:
    """Raises `NotAVariableError` unless each entry can be assigned."""
    for variable in variables:
        if not hasattr(variable, "assign_sub"):
            raise NotAVariableError(
                "Only variables can be trained; got "
                f"{_describe(variable)}, which cannot be updated. Pass the "
                "tf.Variable (or Keras variable) the loss was computed from.")


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{text if len(text) < 120 else text[:117] + '...'} of type " \
        f"{type(value).__name__}"


def _shape_text(shape: tf.TensorShape) -> str:
    return str(tuple(shape.as_list())) if shape.rank is not None else "?"


def check_gradients(grads: Sequence[Any], variables: Sequence[Any]) -> None:
    """Raises unless each gradient fits its variable (None is allowed).

    A gradient must be floating point (the unscale would turn an integer
    one into zeros) and have the variable's shape (for `tf.IndexedSlices`,
    its rows must).

    Raises:
      NotAVariableError: a "variable" is not one.
      TypeError: a gradient is not floating point.
      GradientShapeError: a gradient's shape does not fit its variable's
        (a ValueError and an InvalidArgumentError).
    """
    check_variables(variables)
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
            raise GradientShapeError(
                f"The gradient for variable {name!r} has shape "
                f"{_shape_text(shape)}, which does not fit the variable's "
                f"shape {_shape_text(expected)}.")


def checked_sparse_rows(grads: Sequence[Any], variables: Sequence[Any],
                        verdict: Optional[Any] = None
                        ) -> Tuple[List[Any], Optional[Any]]:
    """Checks that each `tf.IndexedSlices` gradient indexes its variable.

    An out-of-range row fails only inside the inner optimizer's update,
    after the variables before it were updated; checked first, a step that
    raises changes nothing (as in Keras 3, whose step fails before any
    update). Eagerly the check runs here and raises at once. In a graph it
    is an assertion that the returned gradients' values (which the
    finiteness verdict reads, and every update waits for) and the returned
    `verdict` depend on. Without sparse gradients, `grads` and `verdict`
    come back as they are: no op is added.

    Raises:
      tf.errors.InvalidArgumentError: a row index is negative or not below
        the variable's number of rows (eagerly; in a graph, when it runs).
    """
    checks = []
    for grad, variable in zip(grads, variables):
        rows = _static_rows(variable)
        if isinstance(grad, tf.IndexedSlices) and rows is not None:
            indices = grad.indices
            message = (f"A tf.IndexedSlices gradient has a row index outside "
                       f"its variable {variable_name(variable)!r} of {rows} rows; "
                       "nothing was updated.")
            checks.append(tf.debugging.assert_non_negative(
                indices, message=message))
            checks.append(tf.debugging.assert_less(
                indices, tf.cast(rows, indices.dtype), message=message))
    graph_checks = [c for c in checks if c is not None]
    if not graph_checks:
        return list(grads), verdict
    with tf.control_dependencies(graph_checks):
        gated = [tf.IndexedSlices(tf.identity(g.values), g.indices,
                                  g.dense_shape)
                 if isinstance(g, tf.IndexedSlices) else g for g in grads]
        if verdict is not None:
            verdict = tf.identity(verdict)
    return gated, verdict


def _static_rows(variable: Any) -> Optional[int]:
    shape = tf.TensorShape(getattr(variable, "shape", None))
    if shape.rank is None or shape.rank == 0:
        return None
    return shape[0]


