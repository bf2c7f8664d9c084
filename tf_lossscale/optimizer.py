"""`LossScaleOptimizer`: the public class, and what every Keras flavour shares.

`tf_lossscale.LossScaleOptimizer(inner, ...)` returns the flavour that fits
the type of `inner` (`__new__` below says which); every flavour subclasses
this class, so `isinstance(opt, tf_lossscale.LossScaleOptimizer)` holds for
all of them. What is not specific to one Keras lives here, for the flavours
to inherit rather than copy:

- argument checks (`check_settings`, `reject_loss_scale_optimizer`),
- the attributes `dynamic`, `dynamic_counter`, `dynamic_growth_steps`,
  `initial_scale`, `loss_scale`,
- `get_scaled_loss` / `get_unscaled_gradients`,
- `get_config` / `from_config` (through `config_conversion`, so TF <= 2.3
  and Keras 3 configs load too),
- the per-step decision `_loss_scaled_apply`: unscale and check
  (`finite.py`), agree across replicas, advance the scale
  (`state_machine.next_state`), then apply the inner update or skip it.

A flavour provides the variables `dynamic_scale` (float32) and
`step_counter` (int64) when dynamic, an attribute `inner_optimizer`, and the
hooks `_apply_inner(grads, variables)` and `_skip_inner()`.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import weakref
from typing import (Any, Callable, Dict, List, Mapping, Optional, Sequence,
                    Union)

import tensorflow as tf

from tf_lossscale import _checks
from tf_lossscale import _tf_private
from tf_lossscale import config_conversion
from tf_lossscale import finite as finite_lib
from tf_lossscale.state_machine import next_state

__all__ = [
    "InnerAttribute",
    "LossScaleOptimizer",
    "Settings",
    "UnscaledMarks",
    "apply_or_skip",
    "check_gradients",
    "check_settings",
    "reject_loss_scale_optimizer",
    "require_replica_context",
]

# The optimizer's dynamic rule always doubles and halves.
MULTIPLIER = 2.0

Loss = Union[tf.Tensor, Callable[[], tf.Tensor]]


@dataclasses.dataclass(frozen=True)
class Settings:
    """The checked loss-scaling arguments of one optimizer."""

    dynamic: bool
    initial_scale: float
    dynamic_growth_steps: Optional[int]


def check_settings(dynamic: Any, initial_scale: Any,
                   dynamic_growth_steps: Any) -> Settings:
    """Checks the loss-scaling arguments and fills in the defaults.

    Dynamic scaling defaults to `initial_scale=2**15` (any finite number > 0,
    like `DynamicLossScale`) and `dynamic_growth_steps=2000` (an int >= 1).
    A fixed scale (`dynamic=False`) needs `initial_scale` (a number >= 1,
    like `FixedLossScale`) and takes no `dynamic_growth_steps`.

    Raises:
      TypeError: `dynamic` is not a bool.
      ValueError: a number is missing, of the wrong type or out of range.
    """
    if not isinstance(dynamic, bool):
        raise TypeError(
            "dynamic must be a bool (True for dynamic loss scaling, False for "
            f"a fixed scale); got {dynamic!r} of type "
            f"{type(dynamic).__name__}. To pass a legacy loss_scale such as "
            "'dynamic' or 128, use tf_lossscale.experimental."
            "LossScaleOptimizer(optimizer, loss_scale).")
    if dynamic:
        if initial_scale is None:
            initial_scale = config_conversion.DEFAULT_INITIAL_SCALE
        if dynamic_growth_steps is None:
            dynamic_growth_steps = config_conversion.DEFAULT_GROWTH_STEPS
        return Settings(
            True,
            _checks.check_real("initial_scale", initial_scale, minimum=0.0,
                               inclusive=False),
            _checks.check_int("dynamic_growth_steps", dynamic_growth_steps,
                              minimum=1))
    if initial_scale is None:
        raise ValueError(
            "initial_scale is required when dynamic=False (it is the fixed "
            "loss scale): pass a number >= 1; got None.")
    if dynamic_growth_steps is not None:
        raise ValueError(
            "dynamic_growth_steps must be None when dynamic=False (a fixed "
            f"scale never grows); got {dynamic_growth_steps!r}.")
    return Settings(
        False, _checks.check_real("initial_scale", initial_scale, minimum=1.0),
        None)


def _loss_scale_optimizer_types() -> tuple:
    """Every LossScaleOptimizer class loaded in this process."""
    import keras  # Keras 3; imported here to keep `import tf_lossscale` lean.
    types = [LossScaleOptimizer, keras.mixed_precision.LossScaleOptimizer]
    tf_keras = sys.modules.get("tf_keras")  # Not loaded: nothing to reject.
    if tf_keras is not None:
        types.append(tf_keras.mixed_precision.LossScaleOptimizer)
    return tuple(types)


def reject_loss_scale_optimizer(inner_optimizer: Any) -> None:
    """Raises `TypeError` if `inner_optimizer` is a LossScaleOptimizer.

    Any of them: this package's, Keras 3's, tf_keras'. Wrapping one would
    scale the loss twice and skip steps on a stale verdict.
    """
    if isinstance(inner_optimizer, _loss_scale_optimizer_types()):
        raise TypeError(
            "A LossScaleOptimizer cannot wrap another LossScaleOptimizer; got "
            f"{type(inner_optimizer).__module__}."
            f"{type(inner_optimizer).__qualname__} "
            f"{getattr(inner_optimizer, 'name', '')!r}. Pass the optimizer "
            "it wraps (its `inner_optimizer`) instead.")


def _variable_name(variable: Any) -> str:
    """Keras 3's path, or a tf.Variable's name without its ':0' output index."""
    return getattr(variable, "path", None) or variable.name.rsplit(":", 1)[0]


def _shape_text(shape: tf.TensorShape) -> str:
    return str(tuple(shape.as_list())) if shape.rank is not None else "?"


def require_replica_context() -> None:
    """Raises `ValueError` in a cross-replica context (outside `strategy.run`).

    A step must run once per replica, where each replica votes on the
    verdict; in the cross-replica context there is no replica to vote.
    """
    if tf.distribute.in_cross_replica_context():
        raise ValueError(
            "LossScaleOptimizer.apply_gradients() must be called in a "
            "replica context (inside strategy.run), not in the "
            "cross-replica context of "
            f"{type(tf.distribute.get_strategy()).__name__}.")


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


class UnscaledMarks:
    """Where `get_unscaled_gradients` ran and no apply has run since.

    A place is a pair (graph, thread): the graph being traced (None when
    eager) and the Python thread, because `MirroredStrategy` runs each
    replica's step in a thread of its own. The pair makes the rule exact
    inside `tf.function` (each trace keeps its own marks, and the decision is
    traced into the graph) and under replicas.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._eager: set = set()
        self._traced: "weakref.WeakKeyDictionary[tf.Graph, set]" = (
            weakref.WeakKeyDictionary())

    def _threads(self) -> set:
        if tf.executing_eagerly():
            return self._eager
        return self._traced.setdefault(tf.compat.v1.get_default_graph(), set())

    def mark(self) -> None:
        """Records that gradients were unscaled here."""
        with self._lock:
            self._threads().add(threading.get_ident())

    def take(self) -> bool:
        """Returns whether gradients were unscaled here, and forgets it."""
        with self._lock:
            threads = self._threads()
            ident = threading.get_ident()
            found = ident in threads
            threads.discard(ident)
            return found


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


def _cond(pred: tf.Tensor, true_fn: Callable[[], Any],
          false_fn: Callable[[], Any]) -> None:
    """`tf.cond` for branches run for their effects; eagerly, only one runs."""

    def run(fn):
        def branch():
            fn()
            return tf.constant(0)  # Both branches return the same structure.
        return branch

    tf.cond(pred, run(true_fn), run(false_fn))


def apply_or_skip(finite: tf.Tensor, grads: List[Any],
                  apply_fn: Callable[[List[Any]], Any],
                  skip_fn: Callable[[], Any]) -> None:
    """Runs `apply_fn(grads)` if `finite`, else `skip_fn()`. Replica context.

    `finite` must already be the same on every replica
    (`finite.agree_across_replicas`): each replica then takes the same
    branch, so collectives inside `apply_fn` (the gradient all-reduce) match.
    Strategies that update through `merge_call` (MirroredStrategy on CPU, or
    without XLA) cannot hold a `merge_call` inside a branch traced in a
    replica context, so there the branch is taken in the cross-replica
    context and `apply_fn` runs per replica, as Keras' own optimizers do.
    """
    if _tf_private.strategy_supports_no_merge_call():
        _cond(finite, lambda: apply_fn(grads), skip_fn)
        return

    def cross_replica(strategy, finite, grads):
        # Every replica holds the same agreed verdict; read the first.
        verdict = strategy.experimental_local_results(finite)[0]
        _cond(verdict,
              lambda: strategy.extended.call_for_each_replica(
                  apply_fn, args=(grads,)),
              skip_fn)

    tf.distribute.get_replica_context().merge_call(
        cross_replica, args=(finite, grads))


class LossScaleOptimizer:
    """An optimizer that scales the loss so float16 gradients do not underflow.

    `LossScaleOptimizer(inner_optimizer, dynamic=True, initial_scale=None,
    dynamic_growth_steps=None)` wraps a Keras 3 or a tf_keras optimizer
    and returns the flavour for its type.

    Dynamic scaling (the default) starts at `initial_scale` (2**15) and, per
    step: a step with any NaN or Inf gradient is skipped (no model variable
    and no optimizer slot changes) and halves the scale, never below 1; after
    `dynamic_growth_steps` (2000) consecutive finite steps the scale doubles,
    unless that would make it non-finite. `iterations` (the inner
    optimizer's) advances on every step, applied or skipped, as TensorFlow's
    optimizer did. Under a distribution strategy, a non-finite gradient on
    any replica makes every replica skip. With `dynamic=False` the scale is
    `initial_scale` forever and every step is applied.

    Two ways to use it meet in `apply_gradients` / `apply`:

    - TensorFlow's documented one: `get_scaled_loss(loss)`, gradients,
      `get_unscaled_gradients(grads)`, then `apply_gradients` with the
      unscaled gradients (clip or otherwise change them in between if you
      like);
    - Keras 3's, which `fit` uses: `scale_loss(loss)`, gradients, then
      `apply_gradients` with the still scaled gradients.

    The rule: `apply_gradients` / `apply` take their gradients as already
    unscaled if and only if `get_unscaled_gradients` was called on this
    optimizer since the last `apply_gradients` / `apply`, in the same graph
    (the same `tf.function` trace, or eagerly) and the same Python thread;
    otherwise they take them as scaled by the current loss scale and unscale
    them. The decision is made in Python when the step runs eagerly or is
    traced, so it costs nothing per step inside a `tf.function`.

    Args:
      inner_optimizer: the optimizer to wrap (not a LossScaleOptimizer).
      dynamic: True for dynamic loss scaling, False for a fixed scale.
      initial_scale: the first scale: a finite number > 0, default 2**15,
        when dynamic; the fixed scale, a number >= 1 and required, when not.
      dynamic_growth_steps: an int >= 1, default 2000, when dynamic; must
        be None when not.

    Raises:
      TypeError: `inner_optimizer` is not an optimizer of a supported Keras,
        or is a LossScaleOptimizer; `dynamic` is not a bool.
      ValueError: a number is missing, of the wrong type or out of range.
    """

    # Only the public classes pick a flavour; a flavour builds itself.
    _DISPATCHES = True
    _INNER_ARGUMENT = "inner_optimizer"

    def __new__(cls, *args: Any, **kwargs: Any) -> "LossScaleOptimizer":
        if cls.__dict__.get("_DISPATCHES", False):
            inner = args[0] if args else kwargs.get(cls._INNER_ARGUMENT)
            cls = cls._flavour_for(inner)
        return super().__new__(cls)

    @classmethod
    def _flavour_for(cls, inner_optimizer: Any) -> type:
        """The class that wraps `inner_optimizer`, chosen by its type."""
        reject_loss_scale_optimizer(inner_optimizer)
        import keras  # Keras 3.
        if isinstance(inner_optimizer, keras.optimizers.Optimizer):
            from tf_lossscale.keras_optimizer import KerasLossScaleOptimizer
            return KerasLossScaleOptimizer
        # An optimizer of tf_keras means tf_keras is loaded; if it is not,
        # the optimizer is not one of its.
        tf_keras = sys.modules.get("tf_keras")
        if tf_keras is not None and isinstance(
                inner_optimizer, (tf_keras.optimizers.Optimizer,
                                  tf_keras.optimizers.legacy.Optimizer)):
            from tf_lossscale import tf_keras_optimizer
            return tf_keras_optimizer.flavour_for(inner_optimizer)
        raise TypeError(
            "inner_optimizer must be a Keras 3 optimizer (an instance of "
            "keras.optimizers.Optimizer, which is tf.keras.optimizers."
            "Optimizer on TensorFlow >= 2.16) or a tf_keras optimizer (an "
            "instance of tf_keras.optimizers.Optimizer); got "
            f"{inner_optimizer!r} of type {type(inner_optimizer).__module__}."
            f"{type(inner_optimizer).__qualname__}.")

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
        """Finite steps after which the scale doubles; None if not dynamic."""
        return self._settings.dynamic_growth_steps

    @property
    def dynamic_counter(self) -> Optional[tf.Tensor]:
        """Finite steps since the scale last changed, an int64 scalar tensor.

        None if not dynamic. It restarts at 0 when the scale doubles and when
        a step is skipped. (A tensor, like `loss_scale`: `int()` of it works
        under any strategy, which a distributed variable's does not.)
        """
        if not self.dynamic:
            return None
        return tf.convert_to_tensor(self.step_counter)

    @property
    def loss_scale(self) -> tf.Tensor:
        """The current loss scale, a scalar float32 tensor."""
        if self.dynamic:
            return tf.convert_to_tensor(self.dynamic_scale)
        return tf.constant(self._settings.initial_scale, tf.float32)

    # The documented scaling methods.

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
        return loss * tf.cast(self.loss_scale, loss.dtype)

    def get_unscaled_gradients(self, grads: Sequence[Any]) -> List[Any]:
        """Returns the gradients divided by the loss scale.

        None entries stay None, `tf.IndexedSlices` stay sparse, every dtype
        is kept. Marks that the next `apply_gradients` here gets unscaled
        gradients (see the class docstring).
        """
        unscaled = finite_lib.unscale_all(list(grads), self.loss_scale)
        self._unscaled_marks.mark()
        return unscaled

    # The step.

    def _loss_scaled_apply(self, grads: List[Any], variables: List[Any],
                           already_unscaled: bool) -> None:
        """One step in a replica context: check, agree, apply or skip, rescale.

        A non-finite verdict (on any replica) skips the inner update and
        only advances `iterations`; then the scale and counter follow
        `next_state`.
        """
        if not self.dynamic:
            if not already_unscaled:
                grads = finite_lib.unscale_all(grads, self.loss_scale)
            self._apply_inner(grads, variables)
            return
        if already_unscaled:
            unscaled, finite = grads, finite_lib.all_finite(grads)
        else:
            unscaled, finite = finite_lib.unscale_and_check(
                grads, self.loss_scale)
        finite = finite_lib.agree_across_replicas(finite)
        apply_or_skip(finite, unscaled,
                      lambda g: self._apply_inner(g, variables),
                      self._skip_inner)
        # Last, so that an inner optimizer that raises leaves it unchanged.
        self._advance_scale(finite)

    def _advance_scale(self, finite: tf.Tensor) -> None:
        """Assigns the scale and counter that follow a step (`next_state`).

        In a replica context every replica assigns its own copy (the
        variables aggregate with NONE) the same agreed value.
        """
        scale, good_steps = next_state(
            tf.convert_to_tensor(self.dynamic_scale),
            tf.convert_to_tensor(self.step_counter), finite,
            period=self._settings.dynamic_growth_steps, multiplier=MULTIPLIER)
        self.dynamic_scale.assign(scale)
        self.step_counter.assign(good_steps)

    def _apply_inner(self, grads: List[Any], variables: List[Any]) -> None:
        """Applies unscaled gradients with the inner optimizer."""
        raise NotImplementedError

    def _skip_inner(self) -> None:
        """Advances the inner optimizer's `iterations` by one, nothing else."""
        raise NotImplementedError

    # Serialization.

    def get_config(self) -> Dict[str, Any]:
        """The inner optimizer (serialized) and the loss-scaling arguments."""
        return {
            "inner_optimizer": self._serialize_inner(),
            "dynamic": self.dynamic,
            "initial_scale": self.initial_scale,
            "dynamic_growth_steps": self.dynamic_growth_steps,
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
        inner = cls._deserialize_inner(
            config.pop("inner_optimizer"), custom_objects)
        return cls._from_current_args(inner, config)

    @classmethod
    def _from_current_args(cls, inner_optimizer: Any,
                           args: Dict[str, Any]) -> "LossScaleOptimizer":
        return cls(inner_optimizer, **args)

    def _serialize_inner(self) -> Dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def _deserialize_inner(cls, config: Any,
                           custom_objects: Optional[Dict[str, Any]]) -> Any:
        """The inner optimizer of a config: an object stays as it is."""
        if not isinstance(config, dict):
            return config
        # Only tf_keras writes `is_legacy_optimizer` into an optimizer's
        # config: then the public class picks the tf_keras flavour, as its
        # constructor would. The tf_keras flavour overrides this method.
        if "is_legacy_optimizer" in config.get("config", {}):
            from tf_lossscale.tf_keras_optimizer import (
                TfKerasLossScaleOptimizer)
            return TfKerasLossScaleOptimizer._deserialize_inner(
                config, custom_objects)
        import keras
        try:
            return keras.optimizers.deserialize(
                config, custom_objects=custom_objects)
        except (TypeError, ValueError) as e:
            raise TypeError(
                "inner_optimizer must be a Keras 3 optimizer or its config; "
                f"Keras could not deserialize {config!r}: {e}") from e
