"""Loss scales: `LossScale`, `FixedLossScale`, `DynamicLossScale`, `get`.

A loss scale multiplies the loss before differentiation so that small
float16 gradients do not underflow, and says after each step whether the
gradients may be applied::

    loss = loss * loss_scale()
    grads = tape.gradient(loss, vars)
    grads = [g / loss_scale() for g in grads]
    update_op, should_apply = loss_scale.update(grads)

`DynamicLossScale` is the variable shell around `state_machine.transition`;
its variables use TensorFlow's checkpoint keys (`current_loss_scale`,
`good_steps`), so checkpoints interchange with
`tf.compat.v1.mixed_precision.DynamicLossScale` both ways. Variables are
kept per TF1 graph, as TensorFlow does, so one loss scale can serve several
graphs; in eager mode and inside `tf.function` there is one pair.
"""

from __future__ import annotations

import abc
from typing import Any, Dict, Optional, Tuple, Union

import tensorflow as tf

from tf_lossscale import _checks, distribute, state_machine, step
from tf_lossscale._tf_private import Trackable

__all__ = [
    "DynamicLossScale",
    "FixedLossScale",
    "LossScale",
    "LossScaleConfigError",
    "deserialize",
    "get",
    "serialize",
]

UpdateResult = Tuple[Optional[Union[tf.Operation, tf.Tensor]],
                     Union[bool, tf.Tensor]]


def _graph_key() -> Optional[tf.Graph]:
    """None when eager (also inside a `tf.function`), else the TF1 graph."""
    with tf.init_scope():
        if tf.executing_eagerly():
            return None
        return tf.compat.v1.get_default_graph()


class LossScale(Trackable, abc.ABC):
    """Base class of loss scales: `__call__`, `update`, `get_config`.

    Calling an instance returns the loss scale as a float32 scalar tensor.
    `update(grads)` adjusts it from the gradients of one step and returns
    `(update_op, should_apply_gradients)`. Under a `tf.distribute` strategy
    `update` may only be called in a cross-replica context.
    """

    def __init__(self) -> None:
        # name -> (initial value, dtype); name, graph key -> variable.
        self._weight_specs: Dict[str, Tuple[Any, tf.DType]] = {}
        self._weights: Dict[Tuple[str, Optional[tf.Graph]], tf.Variable] = {}

    @abc.abstractmethod
    def __call__(self) -> tf.Tensor:
        """Returns the current loss scale as a scalar float32 tensor."""

    @abc.abstractmethod
    def update(self, grads: Any) -> UpdateResult:
        """Updates the loss scale from one step's (unscaled) gradients.

        Returns:
          `(update_op, should_apply_gradients)`: `update_op` is None in eager
          mode (the update has happened) and an op in graph mode (nothing
          changes until it runs); `should_apply_gradients` is a bool or a
          scalar bool tensor, False when the step must be skipped.
        """

    @abc.abstractmethod
    def get_config(self) -> Dict[str, Any]:
        """Returns the constructor arguments of this loss scale."""

    @classmethod
    def from_config(cls, config: Dict[str, Any]) -> "LossScale":
        """Creates the loss scale from `get_config()`'s output."""
        return cls(**config)

    # Variables, one set per TF1 graph, tracked under their plain names.

    def _add_weight(self, name: str, initial_value: Any,
                    dtype: tf.DType) -> tf.Variable:
        self._weight_specs[name] = (initial_value, dtype)
        return self._weight(name)

    def _weight(self, name: str) -> tf.Variable:
        key = (name, _graph_key())
        variable = self._weights.get(key)
        if variable is None:
            initial_value, dtype = self._weight_specs[name]
            with tf.init_scope():
                variable = tf.Variable(
                    initial_value, name=name, dtype=dtype, trainable=False,
                    synchronization=tf.VariableSynchronization.AUTO,
                    # Loss-scale state is the same on every replica and is
                    # assigned, never aggregated.
                    aggregation=tf.VariableAggregation.NONE)
            self._weights[key] = variable
            self._handle_deferred_dependencies(name=name, trackable=variable)
        return variable

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        graph = _graph_key()
        children = {name: v for (name, g), v in sorted(
            self._weights.items(), key=lambda item: item[0][0]) if g is graph}
        children.update(super()._trackable_children(save_type, **kwargs))
        return children

    def _lookup_dependency(self, name, cached_dependencies=None):
        found = super()._lookup_dependency(name, cached_dependencies)
        if found is not None:
            return found
        return self._weights.get((name, _graph_key()))


class FixedLossScale(LossScale):
    """A loss scale that never changes; `update` always says "apply"."""

    def __init__(self, loss_scale_value: float) -> None:
        """Creates the fixed loss scale.

        Args:
          loss_scale_value: the scale, a Python or NumPy int or float >= 1
            (and at most the float32 maximum).

        Raises:
          ValueError: `loss_scale_value` is not such a number.
        """
        value = _check_fixed_value(loss_scale_value)
        super().__init__()
        self._loss_scale_value = value

    def __call__(self) -> tf.Tensor:
        return tf.constant(self._loss_scale_value, dtype=tf.float32)

    @tf.autograph.experimental.do_not_convert
    def update(self, grads: Any) -> UpdateResult:
        del grads  # A fixed scale does not look at the gradients.
        return tf.no_op(), True

    def get_config(self) -> Dict[str, Any]:
        return {"loss_scale_value": self._loss_scale_value}

    def __repr__(self) -> str:
        return f"FixedLossScale({self._loss_scale_value})"


def _check_fixed_value(value: Any) -> float:
    """`check_real` for `loss_scale_value`, its message led by TF's phrase."""
    # Python and NumPy numbers only, as TensorFlow's class (a tensor is not
    # one, unlike for DynamicLossScale).
    try:
        if not _checks.is_real(value):
            raise _checks.NotANumberError(
                "loss_scale_value must be a Python int or float. "
                "loss_scale_value must be a finite int or float >= 1; got "
                f"{value!r} of type {type(value).__name__}.")
        return _checks.check_real("loss_scale_value", value, minimum=1.0)
    except _checks.NotANumberError:
        raise
    except ValueError as e:
        if not _checks.is_real(value):
            phrase = "a Python int or float"
        elif value < 1:
            phrase = "at least 1"
        else:  # NaN, Inf or beyond float32: TensorFlow has no phrase.
            raise
        raise ValueError(f"loss_scale_value must be {phrase}. {e}") from None


class DynamicLossScale(LossScale):
    """A loss scale that backs off on overflow, grows while steps are finite.

    Every `increment_period` consecutive steps with finite gradients the scale
    is multiplied by `multiplier` (unless that would make it non-finite). A
    step with a NaN or Inf gradient divides it by `multiplier` (never below
    1), restarts the count, and must be skipped by the caller. The rule lives
    in `state_machine.transition`.
    """

    def __init__(self, initial_loss_scale: float = 2**15,
                 increment_period: int = 2000,
                 multiplier: float = 2.0) -> None:
        """Creates the dynamic loss scale.

        Args:
          initial_loss_scale: the starting scale, a finite number > 0. Start
            high: a scale that is too high falls far faster than one that is
            too low rises.
          increment_period: finite steps, an int >= 1, after which the scale
            grows.
          multiplier: growth and back-off factor, a finite number > 1.

        Raises:
          ValueError: an argument is not a number of the accepted range.
        """
        initial = _checks.check_real(
            "initial_loss_scale", initial_loss_scale, minimum=0.0,
            inclusive=False)
        period = _checks.check_int(
            "increment_period", increment_period, minimum=1)
        factor = _checks.check_real(
            "multiplier", multiplier, minimum=1.0, inclusive=False)
        super().__init__()
        self._initial_loss_scale = initial
        self._increment_period = period
        self._multiplier = factor
        self._add_weight("current_loss_scale", initial, tf.float32)
        self._add_weight("good_steps", 0, tf.int64)

    @property
    def initial_loss_scale(self) -> float:
        return self._initial_loss_scale

    @property
    def increment_period(self) -> int:
        return self._increment_period

    @property
    def multiplier(self) -> float:
        return self._multiplier

    @property
    def good_steps(self) -> tf.Tensor:
        """Consecutive finite steps since the scale last changed (int64)."""
        return tf.convert_to_tensor(self._weight("good_steps"))

    # TensorFlow's own names for the two variables. They are private there,
    # yet legacy code reads and assigns them (`ls._current_loss_scale`).
    @property
    def _current_loss_scale(self) -> tf.Variable:
        return self._weight("current_loss_scale")

    @property
    def _num_good_steps(self) -> tf.Variable:
        return self._weight("good_steps")

    def __call__(self) -> tf.Tensor:
        return tf.convert_to_tensor(self._weight("current_loss_scale"))

    @tf.autograph.experimental.do_not_convert
    def update(self, grads: Any) -> UpdateResult:
        """Adjusts the scale from one step's gradients (see the class doc).

        In graph mode `update_op` is a bool tensor, as TensorFlow's class
        returns: running it performs the update, and its value says whether
        this step was a growth step (finite and the period reached).

        Raises:
          ReplicaContextError: called in a replica context under a
            strategy (a `RuntimeError`).
        """
        finite = distribute.cross_replica_all_finite(grads)
        rule = state_machine.Rule(
            period=self._increment_period, growth_factor=self._multiplier,
            backoff_divisor=self._multiplier)
        good_steps = self._weight("good_steps")
        variables = step.ScaleVariables(
            scale=self._weight("current_loss_scale"), good_steps=good_steps)
        growth_step = tf.logical_and(
            finite, tf.convert_to_tensor(good_steps) + 1 >= rule.period)
        with tf.control_dependencies([growth_step]):
            update_op = step.advance(variables, finite, rule)
        if tf.executing_eagerly():
            return None, finite
        with tf.control_dependencies([update_op]):
            return tf.identity(growth_step), finite

    def get_config(self) -> Dict[str, Any]:
        return {
            "initial_loss_scale": self._initial_loss_scale,
            "increment_period": self._increment_period,
            "multiplier": self._multiplier,
        }

    def __repr__(self) -> str:
        config = ", ".join(f"{k}={v}" for k, v in self.get_config().items())
        if tf.executing_eagerly():
            # str() as TensorFlow's '%s': a float32 prints as 0.275, where
            # format() would widen it to 0.2750000059604645.
            return (f"DynamicLossScale(current_loss_scale="
                    f"{str(self().numpy())}, "
                    f"num_good_steps={self.good_steps.numpy()}, {config})")
        return f"DynamicLossScale({config})"


_CLASSES = {cls.__name__: cls for cls in (FixedLossScale, DynamicLossScale)}


# TensorFlow's own loss scales, which work wherever ours do (same methods,
# same checkpoint keys): `get` and `serialize` take them as TensorFlow does.
_TF_LOSS_SCALE: Any = tf.compat.v1.mixed_precision.LossScale


class LossScaleConfigError(ValueError, TypeError):
    """A loss-scale config whose entries do not fit its class.

    A ValueError, as this package raises for bad input, and a TypeError,
    as TensorFlow's `deserialize` raises there (from the constructor).
    """

    # Rebuildable by AutoGraph (see `distribute.ReplicaContextError`).
    __init__ = Exception.__init__


def get(identifier: Any) -> Any:
    """Returns a loss scale for `identifier`.

    None gives None, a `LossScale` (ours or TensorFlow's) itself, an int or
    float a `FixedLossScale`, the string "dynamic" a default
    `DynamicLossScale`, and a dict what `deserialize` makes of it (as
    TensorFlow's Keras `get` does).

    Raises:
      ValueError: any other identifier.
    """
    if identifier is None or isinstance(identifier, (LossScale,
                                                     _TF_LOSS_SCALE)):
        return identifier
    if isinstance(identifier, dict):
        try:
            return deserialize(identifier)
        except LossScaleConfigError:
            raise
        except ValueError as e:
            raise ValueError(f"{_not_an_identifier(identifier)} {e}") from None
    # isinstance first: `==` on a tensor or array is elementwise or raises.
    if isinstance(identifier, str) and identifier == "dynamic":
        return DynamicLossScale()
    if _checks.is_real(identifier):
        return FixedLossScale(identifier)
    raise ValueError(_not_an_identifier(identifier))


def _not_an_identifier(identifier: Any) -> str:
    # TensorFlow's phrase first, so code matching its message still does.
    return (
        f"Could not interpret loss scale identifier: {identifier}. A loss "
        "scale identifier must be None, 'dynamic', an int or float >= 1, or "
        f"a LossScale instance; got {identifier!r} of type "
        f"{type(identifier).__name__}. A serialized loss scale (a dict "
        "{'class_name': ..., 'config': ...}) is taken too.")


def serialize(loss_scale: Any) -> Optional[Dict[str, Any]]:
    """Returns `{"class_name": ..., "config": ...}` for a loss scale.

    Any `LossScale` (ours, a subclass, or TensorFlow's own); None gives
    None, as TensorFlow's Keras `serialize` does.
    """
    if loss_scale is None:
        return None
    if not isinstance(loss_scale, (LossScale, _TF_LOSS_SCALE)):
        raise ValueError(
            "serialize() takes a FixedLossScale or DynamicLossScale; got "
            f"{loss_scale!r} of type {type(loss_scale).__name__}. (Any "
            "LossScale, TensorFlow's included, and None are taken too.)")
    return {"class_name": type(loss_scale).__name__,
            "config": loss_scale.get_config()}


_ACCEPTED_CONFIG = (
    "a dict {'class_name': 'FixedLossScale' or 'DynamicLossScale', "
    "'config': {...}}")
_ALSO_ACCEPTED = (
    " (Also taken: a class name of custom_objects in 'class_name', a bare "
    "class name, and None.)")


def deserialize(config: Any,
                custom_objects: Optional[Dict[str, Any]] = None) -> Any:
    """Inverse of `serialize`: a loss scale from its config.

    As TensorFlow's Keras `deserialize`: `custom_objects` maps further class
    names to classes, a bare class name builds that class with its
    defaults, None gives None, and Keras 3's extra entries (`module`,
    `registered_name`) are ignored.

    Raises:
      ValueError: `config` names no known class or is not such a config.
      LossScaleConfigError: the config's entries do not fit the class (a
        ValueError and a TypeError).
    """
    if config is None:
        return None
    if isinstance(config, str):
        return _class_named(config, custom_objects, config)()
    if not isinstance(config, dict) or "class_name" not in config or (
            not isinstance(config.get("config"), dict)):
        raise ValueError(
            f"deserialize() takes {_ACCEPTED_CONFIG}; got {config!r}."
            f"{_ALSO_ACCEPTED}")
    cls = _class_named(config["class_name"], custom_objects, config)
    try:
        return cls.from_config(config["config"])
    except TypeError as e:
        raise LossScaleConfigError(
            f"Config {config['config']!r} does not fit {cls.__name__}: {e}"
        ) from None


def _class_named(name: Any, custom_objects: Optional[Dict[str, Any]],
                 config: Any) -> Any:
    cls = (custom_objects or {}).get(name) if isinstance(name, str) else None
    if cls is None and isinstance(name, str):
        cls = _CLASSES.get(name)
    if cls is None:
        raise ValueError(
            f"Unknown loss scale: {name!r}. deserialize() takes "
            f"{_ACCEPTED_CONFIG}; got {config!r}.{_ALSO_ACCEPTED}")
    return cls
