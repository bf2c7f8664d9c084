"""`LossScaleOptimizer`: the public class, its flavour registry, shared parts.

`tf_lossscale.LossScaleOptimizer(inner, ...)` builds the flavour that wraps
`inner`. Each flavour module defines its class as a subclass of this one
with `wraps=<predicate>`; `__init_subclass__` enters it in the registry of
its nearest public ancestor (this class, or `experimental.
LossScaleOptimizer` for the deprecated twins), and `__new__` picks the first
registered flavour whose predicate accepts `inner`. This module imports no
flavour; `tf_lossscale/__init__.py` says which module serves which Keras
(`add_flavour_loader`), so a flavour whose Keras is not in use is never
imported.

Shared here, so that no flavour writes them again:

- the attributes `dynamic`, `dynamic_counter`, `dynamic_growth_steps`,
  `initial_scale`, `loss_scale`, `skipped_steps` and the knobs;
- `get_scaled_loss` / `get_unscaled_gradients`, and `GradientMarks`, which
  tells `apply_gradients` whether its gradients are scaled;
- `get_config` / `from_config`;
- `InnerAttribute`, a hyperparameter read and written on the inner optimizer.

The step itself is `step.loss_scaled_step`. The methods a traced step
calls are `tf.autograph.experimental.do_not_convert`: they hold no
data-dependent Python control flow (branches are explicit `tf.cond`s), and
AutoGraph converting them cost about 2 s on the first call of a process.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import threading
import weakref
from typing import (
    Any,
    Callable,
    ClassVar,
    Dict,
    List,
    Mapping,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
    Type,
    Union,
)

import tensorflow as tf

from tf_lossscale import config_conversion
from tf_lossscale import finite as finite_lib
from tf_lossscale import settings as settings_lib
from tf_lossscale import step as step_lib

__all__ = [
    "GradientMarks",
    "InnerAttribute",
    "LossScaleOptimizer",
    "Taken",
    "add_flavour_loader",
    "check_gradients",
    "legacy_keras_requested",
    "reject_loss_scale_optimizer",
    "skipped_steps_variable",
    "wrong_family",
]

Loss = Union[tf.Tensor, Callable[[], tf.Tensor]]
Predicate = Callable[[Any], bool]

# Public class -> [(accepts inner optimizer?, flavour)], in definition order.
_REGISTRY: Dict[type, List[Tuple[Predicate, "Type[LossScaleOptimizer]"]]] = {}
# (top-level package of an optimizer's type, module that serves it).
_LOADERS: List[Tuple[str, str]] = []


def add_flavour_loader(package: str, module: str) -> None:
    """Declares that `module` defines the flavour for `package`'s optimizers.

    It is imported the first time an optimizer (or config) of `package` is
    wrapped and no registered flavour accepts it.
    """
    if (package, module) not in _LOADERS:
        _LOADERS.append((package, module))


def _load_flavours(package: Optional[str]) -> bool:
    """Imports the modules serving `package` (every package if None)."""
    loaded = False
    for name, module in _LOADERS:
        if (package is None or name == package) and module not in sys.modules:
            importlib.import_module(module)
            loaded = True
    return loaded


def _type_name(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _loss_scale_optimizer_types() -> tuple:
    """Every LossScaleOptimizer class loaded in this process."""
    types: List[type] = [LossScaleOptimizer]
    for package in ("keras", "tf_keras"):
        module = sys.modules.get(package)  # Not loaded: nothing to reject.
        if module is not None:
            types.append(module.mixed_precision.LossScaleOptimizer)
    return tuple(types)


def reject_loss_scale_optimizer(inner_optimizer: Any) -> None:
    """Raises `TypeError` if `inner_optimizer` is a LossScaleOptimizer.

    Any of them: this package's, Keras 3's, tf_keras'. Wrapping one would
    scale the loss twice and skip steps on a stale verdict.
    """
    if isinstance(inner_optimizer, _loss_scale_optimizer_types()):
        raise TypeError(
            "A LossScaleOptimizer cannot wrap another LossScaleOptimizer; got "
            f"{_type_name(inner_optimizer)} "
            f"{getattr(inner_optimizer, 'name', '')!r}. Pass the optimizer "
            "it wraps (its `inner_optimizer`) instead.")


def _variable_name(variable: Any) -> str:
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
        name = _variable_name(variable)
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


def wrong_family(inner_optimizer: Any, flavour: type,
                 accepted: str) -> TypeError:
    """The error of a flavour class called with what it does not wrap.

    As tf_keras' class of each family refuses the other family's optimizers,
    it names what was passed, what `flavour` accepts (`accepted`) and the
    class to use: the public class the flavour is registered under, which
    picks the flavour, and the flavour it picks for this optimizer.
    """
    public: Any = next(c for c in flavour.__mro__
                       if vars(c).get("_PICKS_FLAVOUR"))
    public_name = ("tf_lossscale.LossScaleOptimizer" if public is
                   LossScaleOptimizer else
                   f"{public.__module__}.{public.__qualname__}")
    try:
        right: Optional[type] = public._flavour_for(inner_optimizer)
    except TypeError:
        right = None
    use = (f"Pass an optimizer it wraps, or use {public_name}, which builds "
           "the class for each family" if right is None else
           f"Use {public_name}, which builds the class for each family: for "
           f"this one, {right.__module__}.{right.__qualname__}")
    return TypeError(
        f"{flavour.__name__} wraps one family of optimizers: {accepted}. Got "
        f"{inner_optimizer!r} of type {_type_name(inner_optimizer)}. {use}.")


def _frozen_keras_hint(inner_optimizer: Any) -> str:
    """What to use instead of TensorFlow's frozen private Keras 2.4 copy."""
    frozen = [cls for cls in type(inner_optimizer).__mro__
              if cls.__module__.startswith("tensorflow.python.keras.")]
    if not frozen:
        return ""
    return (" TensorFlow's frozen private copy of Keras 2.4 "
            "(tensorflow.python.keras) is not supported: use the same "
            f"optimizer from tf_keras.optimizers.legacy (tf_keras.optimizers."
            f"legacy.{frozen[0].__name__}), which has its API.")


def legacy_keras_requested() -> bool:
    """Whether `tf.keras` is tf_keras in this process (TF's own test)."""
    return os.environ.get("TF_USE_LEGACY_KERAS", "").lower() in ("1", "true")


def skipped_steps_variable() -> tf.Variable:
    """The telemetry counter of skipped steps (kept out of checkpoints).

    Every replica assigns it the same agreed count, so it aggregates with
    NONE, and a skipped step counts once, not once per replica.
    """
    with tf.init_scope():
        return tf.Variable(
            0, dtype=tf.int64, trainable=False, name="skipped_steps",
            synchronization=tf.VariableSynchronization.ON_WRITE,
            aggregation=tf.VariableAggregation.NONE)


class _Untracked:
    """A plain holder: neither Keras nor a checkpoint looks inside it."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class _Place:
    """What happened at one place since its last apply."""

    def __init__(self) -> None:
        self.scaled_loss = False
        self.unscaled_inputs: Optional[List[Any]] = None
        self.unscaled_outputs: List[Any] = []
        self.verdict: Optional[tf.Tensor] = None


class Taken(NamedTuple):
    """What `GradientMarks.take` found: whether the gradients are scaled
    (None: no mark, the flavour decides), and the verdict that
    `get_unscaled_gradients` computed if the gradients are its outputs."""

    scaled: Optional[bool]
    verdict: Optional[tf.Tensor] = None


class GradientMarks:
    """Tells `apply_gradients` whether its gradients still carry the scale.

    The rule (API.md section 2), per place since the last apply:

    - `get_unscaled_gradients` ran: the gradients are unscaled, unless they
      are the very tensors that were passed to it (then they are scaled:
      it only looked at them);
    - else `get_scaled_loss` / `scale_loss` ran: scaled;
    - else: the flavour's default (`None` here). `ever_unscaled` tells the
      flavour whether `get_unscaled_gradients` ever ran, anywhere: code
      that accumulates its unscaled gradients and applies them in another
      `tf.function` (OpenNMT-tf, ALBERT pretraining) must not see them
      unscaled a second time.

    A place is a pair (graph, thread): the graph being traced (None when
    eager) and the Python thread, because `MirroredStrategy` runs each
    replica's step in a thread of its own. So the rule is exact inside
    `tf.function` (each trace keeps its own marks; the decision is traced
    into the graph) and under replicas.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ever_unscaled = False
        self._eager: Dict[int, _Place] = {}
        self._traced: "weakref.WeakKeyDictionary[tf.Graph, Dict[int, _Place]]" = (
            weakref.WeakKeyDictionary())

    def _places(self) -> Dict[int, _Place]:
        if tf.executing_eagerly():
            return self._eager
        return self._traced.setdefault(tf.compat.v1.get_default_graph(), {})

    def _here(self) -> _Place:
        return self._places().setdefault(threading.get_ident(), _Place())

    def scaled_loss(self) -> None:
        """Records that the loss was scaled here."""
        with self._lock:
            self._here().scaled_loss = True

    def unscaled(self, inputs: Sequence[Any], outputs: Sequence[Any],
                 verdict: tf.Tensor) -> None:
        """Records that `inputs` were unscaled here into `outputs`, which
        are all finite iff `verdict`."""
        with self._lock:
            self.ever_unscaled = True
            place = self._here()
            first = place.unscaled_inputs is None
            place.unscaled_inputs = (place.unscaled_inputs or []) + [
                g for g in inputs if g is not None]
            place.unscaled_outputs = [g for g in outputs if g is not None]
            place.verdict = verdict if first else None

    def take(self, grads: Sequence[Any]) -> Taken:
        """Whether `grads` are scaled, and their known verdict; forgets the
        place."""
        with self._lock:
            place = self._places().pop(threading.get_ident(), None)
        if place is None:
            return Taken(None)
        present = [g for g in grads if g is not None]
        if place.unscaled_inputs is None:
            return Taken(True if place.scaled_loss else None)
        if present and all(_among(g, place.unscaled_inputs) for g in present):
            return Taken(True)  # It only looked at them.
        reused = place.verdict is not None and len(present) == len(
            place.unscaled_outputs) and all(
            g is x for g, x in zip(present, place.unscaled_outputs))
        return Taken(False, place.verdict if reused else None)


def _among(tensor: Any, tensors: List[Any]) -> bool:
    return any(tensor is x for x in tensors)


class InnerAttribute:
    """A hyperparameter of the LossScaleOptimizer, kept on its inner optimizer.

    An explicit, named property (as Keras writes `learning_rate`), declared
    once per name: `momentum = InnerAttribute("momentum")`. Until the
    instance has its `inner_optimizer`, writes are dropped: those are the
    base optimizer constructor storing its own defaults, which a
    LossScaleOptimizer does not use.
    """

    def __init__(self, name: str) -> None:
        self._name = name

    def _inner(self, obj: Any) -> Any:
        return vars(obj).get("inner_optimizer")

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        inner = self._inner(obj)
        if inner is None or not hasattr(inner, self._name):
            raise AttributeError(
                f"{type(obj).__name__} has no {self._name!r}: it reads that "
                "hyperparameter from its inner optimizer "
                f"{type(inner).__name__}, which has none.")
        return getattr(inner, self._name)

    def __set__(self, obj: Any, value: Any) -> None:
        inner = self._inner(obj)
        if inner is None:
            return
        if not hasattr(inner, self._name):
            raise AttributeError(
                f"Cannot set {self._name!r} on {type(obj).__name__}: its "
                f"inner optimizer {type(inner).__name__} has no such "
                "hyperparameter.")
        setattr(inner, self._name, value)


class LossScaleOptimizer:
    """An optimizer that scales the loss so float16 gradients do not underflow.

    Wraps a Keras 3 or a tf_keras optimizer (of either tf_keras family) and
    builds the flavour for its type.

    Dynamic scaling (the default) starts at `initial_scale` (2**15) and, per
    step: a step with any NaN or Inf gradient is skipped (no model variable
    and no optimizer slot changes) and halves the scale, never below
    `min_scale` (1); after `dynamic_growth_steps` (2000) consecutive finite
    steps the scale doubles, unless that would make it non-finite or above
    `max_scale`. `iterations` (the inner optimizer's) advances on every
    step, applied or skipped, as TensorFlow's optimizer did. Under a
    distribution strategy, a non-finite gradient on any replica makes every
    replica skip. With `dynamic=False` the scale is `initial_scale`
    forever, and a non-finite step is still skipped.

    Two ways to use it meet in `apply_gradients` / `apply`:

    - TensorFlow's documented one: `get_scaled_loss(loss)`, gradients,
      `get_unscaled_gradients(grads)`, then `apply_gradients` with the
      unscaled gradients (clip or otherwise change them in between if you
      like);
    - Keras 3's, which `fit` uses: `scale_loss(loss)`, gradients, then
      `apply_gradients` with the still scaled gradients.

    `GradientMarks` holds the rule that tells them apart; it is decided in
    Python when the step runs eagerly or is traced, so it costs nothing per
    step inside a `tf.function`.

    Args:
      inner_optimizer: the optimizer to wrap (not a LossScaleOptimizer).
      dynamic: True for dynamic loss scaling, False for a fixed scale.
      initial_scale: the first scale: a finite number > 0, default 2**15,
        when dynamic; the fixed scale, a number >= 1 and required, when not.
      dynamic_growth_steps: an int >= 1, default 2000, when dynamic; must
        be None when not.
      min_scale: the floor of a dynamic scale, any finite number > 0;
        default 1. Below `2**-126` the scale floors at `2**-126` (TensorFlow
        flushes subnormal float32s to 0, and 0 would never grow back).
      max_scale: a growth happens only if its result is <= this (default:
        the largest float32).
      growth_factor: the growth multiplier, > 1 (default 2).
      backoff_factor: the back-off multiplier, in (0, 1) (default 0.5).
      hysteresis: non-finite steps since the last growth that it takes to
        back off, an int >= 1 (default 1: every one). Until then a
        non-finite step is skipped and the scale stays.

    Raises:
      TypeError: `inner_optimizer` is not an optimizer of a supported Keras,
        or is a LossScaleOptimizer; `dynamic` is not a bool.
      ValueError: a number is missing, of the wrong type or out of range.
    """

    # Set in the class body of each public class: only those pick a flavour.
    _PICKS_FLAVOUR: ClassVar[bool] = True
    # The name of the argument holding the optimizer to wrap.
    _INNER_ARGUMENT: ClassVar[str] = "inner_optimizer"
    # Whether `apply_gradients` takes unmarked gradients as scaled.
    _UNMARKED_GRADIENTS_ARE_SCALED: ClassVar[bool] = True

    _settings: settings_lib.Settings
    _marks: GradientMarks
    _untracked: "_Untracked"
    inner_optimizer: Any

    def __init_subclass__(cls, wraps: Optional[Predicate] = None,
                          **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if wraps is None:
            return
        public = next(base for base in cls.__mro__[1:]
                      if base.__dict__.get("_PICKS_FLAVOUR", False))
        _REGISTRY.setdefault(public, []).append((wraps, cls))

    def __new__(cls, *args: Any, **kwargs: Any) -> "LossScaleOptimizer":
        if cls.__dict__.get("_PICKS_FLAVOUR", False):
            inner = args[0] if args else kwargs.get(cls._INNER_ARGUMENT)
            cls = cls._flavour_for(inner)
        return super().__new__(cls)

    def __init__(self, inner_optimizer: Any, dynamic: bool = True,
                 initial_scale: Optional[float] = None,
                 dynamic_growth_steps: Optional[int] = None, *,
                 min_scale: float = 1.0, max_scale: Optional[float] = None,
                 growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 hysteresis: int = 1) -> None:
        # Reached only through a flavour's constructor, which calls
        # `_init_loss_scaling` with these arguments.
        raise NotImplementedError(
            f"{type(self).__name__} is not a flavour of LossScaleOptimizer.")

    @classmethod
    def _flavour_for(cls, inner_optimizer: Any
                     ) -> "Type[LossScaleOptimizer]":
        """The registered subclass of `cls` that wraps `inner_optimizer`."""
        reject_loss_scale_optimizer(inner_optimizer)
        for attempt in range(2):
            for accepts, flavour in _REGISTRY.get(cls, []):
                if accepts(inner_optimizer):
                    return flavour
            package = type(inner_optimizer).__module__.split(".")[0]
            if attempt or not _load_flavours(package):
                break
        # Under tf_keras, tf_keras' own sentence first, so code matching
        # its message still does (Keras 3 has no message of its own here).
        theirs = (
            '"inner_optimizer" must be an instance of `tf.keras.optimizers.'
            'Optimizer` or `tf.keras.optimizers.experimental.Optimizer`, but '
            f"got: {inner_optimizer}. " if legacy_keras_requested() else "")
        raise TypeError(
            f"{theirs}inner_optimizer must be a Keras 3 optimizer (an "
            "instance of keras.optimizers.Optimizer, which is tf.keras."
            "optimizers.Optimizer on TensorFlow >= 2.16) or a tf_keras "
            "optimizer (an "
            "instance of tf_keras.optimizers.Optimizer or tf_keras."
            "optimizers.legacy.Optimizer); got "
            f"{inner_optimizer!r} of type {_type_name(inner_optimizer)}."
            f"{_frozen_keras_hint(inner_optimizer)}")

    def _init_loss_scaling(self, settings: settings_lib.Settings) -> None:
        """Stores the checked settings; every flavour's constructor calls it."""
        self._settings = settings
        self._marks = GradientMarks()

    def _set_scale_variables(self, variables: step_lib.ScaleVariables
                             ) -> None:
        """Keeps the variables the step advances, out of automatic tracking.

        A flavour tracks the checkpointed ones itself, under the original's
        keys; a tuple attribute would add keys of its own.
        """
        self._untracked = _Untracked(variables)

    @property
    def _scale_variables(self) -> step_lib.ScaleVariables:
        return self._untracked.value

    # Attributes.

    @property
    def dynamic(self) -> bool:
        """Whether the loss scale changes with the gradients."""
        return self._settings.dynamic

    @property
    def initial_scale(self) -> float:
        """The first loss scale; with `dynamic=False`, the only one."""
        return self._settings.initial_scale

    @property
    def dynamic_growth_steps(self) -> Optional[int]:
        """Finite steps after which the scale grows; None if not dynamic."""
        return self._settings.dynamic_growth_steps

    @property
    def min_scale(self) -> float:
        """The floor of a dynamic scale."""
        return self._settings.min_scale

    @property
    def max_scale(self) -> Optional[float]:
        """The ceiling of growth (None: the largest float32)."""
        return self._settings.max_scale

    @property
    def growth_factor(self) -> float:
        """The multiplier of a growth."""
        return self._settings.growth_factor

    @property
    def backoff_factor(self) -> float:
        """The multiplier of a back-off."""
        return self._settings.backoff_factor

    @property
    def hysteresis(self) -> int:
        """Non-finite steps since the last growth that back off."""
        return self._settings.hysteresis

    @property
    def dynamic_counter(self) -> Optional[tf.Tensor]:
        """Finite steps since the scale last changed, an int64 scalar tensor.

        None if not dynamic. It restarts at 0 when the scale grows and when
        a step is skipped. (A tensor, like `loss_scale`: `int()` of it works
        under any strategy, which a distributed variable's does not.)
        """
        if not self.dynamic:
            return None
        return tf.convert_to_tensor(self._scale_variables.good_steps)

    @property
    def loss_scale(self) -> Any:
        """The current loss scale, a scalar float32 tensor."""
        return self._current_scale()

    @property
    def skipped_steps(self) -> tf.Tensor:
        """Steps skipped since this optimizer was created, an int64 tensor.

        Counted once per step (not per replica); not saved in checkpoints.
        """
        return tf.convert_to_tensor(self._scale_variables.skipped)

    def _current_scale(self) -> tf.Tensor:
        if self.dynamic:
            return tf.convert_to_tensor(self._scale_variables.scale)
        return tf.constant(self._settings.initial_scale, tf.float32)

    # The documented scaling methods.

    @tf.autograph.experimental.do_not_convert
    def get_scaled_loss(self, loss: Loss) -> Loss:
        """Returns `loss` times the loss scale (cast to the loss's dtype).

        Args:
          loss: a tensor, or a callable returning one; then a callable
            returning the scaled loss is returned.
        """
        if callable(loss):
            def scaled_loss() -> tf.Tensor:
                return self.get_scaled_loss(loss())
            return scaled_loss
        loss = tf.convert_to_tensor(loss)
        self._marks.scaled_loss()
        return loss * tf.cast(self._current_scale(), loss.dtype)

    @tf.autograph.experimental.do_not_convert
    def get_unscaled_gradients(self, grads: Sequence[Any]) -> List[Any]:
        """Returns the gradients divided by the loss scale.

        None entries stay None, `tf.IndexedSlices` stay sparse, every dtype
        is kept. The next `apply_gradients` here takes its gradients as
        unscaled, unless they are these very `grads` (see `GradientMarks`).
        """
        grads = list(grads)
        # The check comes with the division at almost no cost; an
        # apply_gradients handed exactly these outputs reuses it (and when
        # nothing reads it, a traced graph drops it).
        unscaled, finite = finite_lib.unscale_and_check(
            grads, self._current_scale())
        self._marks.unscaled(grads, unscaled, finite)
        return unscaled

    def _decide(self, grads: Sequence[Any]
                ) -> Tuple[bool, Optional[tf.Tensor]]:
        """Whether `apply_gradients` gets unscaled `grads`, and their verdict
        if `get_unscaled_gradients` computed it (forgets the marks)."""
        taken = self._marks.take(grads)
        scaled = taken.scaled
        if scaled is None:
            scaled = self._unmarked_gradients_are_scaled()
        return not scaled, taken.verdict

    def _already_unscaled(self, grads: Sequence[Any]) -> bool:
        """Whether `apply_gradients` gets unscaled `grads` (forgets marks)."""
        return self._decide(grads)[0]

    def _unmarked_gradients_are_scaled(self) -> bool:
        """The flavour's default when neither scaling method ran here.

        Once `get_unscaled_gradients` has run on this optimizer, its user
        follows TensorFlow's documented flow, in which `apply_gradients`
        always takes unscaled gradients.
        """
        return (self._UNMARKED_GRADIENTS_ARE_SCALED
                and not self._marks.ever_unscaled)

    def _step(self, grads: List[Any], variables: List[Any],
              already_unscaled: bool,
              keep: Optional[Sequence[bool]] = None,
              verdict: Optional[tf.Tensor] = None) -> tf.Tensor:
        """`step.loss_scaled_step` with this optimizer's parts."""
        return step_lib.loss_scaled_step(
            grads, scale=self._current_scale(),
            already_unscaled=already_unscaled,
            apply=lambda g: self._apply_inner(g, variables),
            skip=self._skip_inner, variables=self._scale_variables,
            rule=self._settings.rule() if self.dynamic else None, keep=keep,
            verdict=verdict)

    def _apply_inner(self, grads: List[Any], variables: List[Any]) -> None:
        """Applies unscaled gradients with the inner optimizer."""
        raise NotImplementedError

    def _skip_inner(self) -> None:
        """Advances the inner optimizer's `iterations` by one, nothing else."""
        raise NotImplementedError

    # Serialization.

    def get_config(self) -> Dict[str, Any]:
        """The inner optimizer (serialized) and the loss-scaling arguments.

        A knob appears only when it is not at its default, so configs with
        default knobs are exactly those of the originals.
        """
        return {
            "inner_optimizer": self._serialize_inner(),
            "dynamic": self.dynamic,
            "initial_scale": self.initial_scale,
            "dynamic_growth_steps": self.dynamic_growth_steps,
            **self._settings.knobs(),
        }

    @classmethod
    def from_config(cls, config: Dict[str, Any],
                    custom_objects: Optional[Dict[str, Any]] = None
                    ) -> "LossScaleOptimizer":
        """Creates the optimizer from `get_config()`'s output.

        Also takes Keras 3's own LossScaleOptimizer configs and the TF <= 2.3
        experimental ones (`optimizer` and `loss_scale` entries), converted
        by `config_conversion.upgrade_optimizer_config`.

        Raises:
          ValueError: `config` is not a dict, has no inner optimizer, or
            holds loss-scaling values that do not convert.
          TypeError: the inner optimizer's config names no known optimizer,
            or `config` holds an unknown key.
        """
        if not isinstance(config, Mapping):
            raise ValueError(
                "from_config() takes a dict (what get_config() returns); "
                f"got {config!r} of type {type(config).__name__}.")
        config = config_conversion.upgrade_optimizer_config(config)
        if "inner_optimizer" not in config:
            raise ValueError(
                "A LossScaleOptimizer config needs an 'inner_optimizer' entry "
                "(or TF <= 2.3's 'optimizer') holding the wrapped optimizer; "
                f"got {config!r}.")
        inner_config = config.pop("inner_optimizer")
        inner = cls._flavour_for_config(inner_config)._deserialize_inner(
            inner_config, custom_objects)
        return cls._from_current_args(inner, config)

    @classmethod
    def _flavour_for_config(cls, inner_config: Any
                            ) -> "Type[LossScaleOptimizer]":
        """The flavour that deserializes `inner_config` (see `_reads`)."""
        if not cls.__dict__.get("_PICKS_FLAVOUR", False):
            return cls
        if not isinstance(inner_config, dict):
            return cls._flavour_for(inner_config)
        for attempt in range(2):
            for _, flavour in _REGISTRY.get(cls, []):
                if flavour._reads(inner_config):
                    return flavour
            if attempt or not _load_flavours(None):
                break
        raise TypeError(
            "inner_optimizer must be the config of a Keras 3 or tf_keras "
            f"optimizer; got {inner_config!r}.")

    @classmethod
    def _reads(cls, inner_config: Dict[str, Any]) -> bool:
        """Whether this flavour deserializes `inner_config` (a flavour says)."""
        return False

    @classmethod
    def _from_current_args(cls, inner_optimizer: Any,
                           args: Dict[str, Any]) -> "LossScaleOptimizer":
        return cls(inner_optimizer, **args)

    def _serialize_inner(self) -> Dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def _deserialize_inner(cls, config: Any,
                           custom_objects: Optional[Dict[str, Any]]) -> Any:
        raise NotImplementedError


# `__new__` picks the flavour; what it accepts is the constructor's.
LossScaleOptimizer.__new__.__signature__ = inspect.signature(  # type: ignore
    LossScaleOptimizer.__init__)
