"""`LossScaleOptimizer`: the public class and what every flavour shares.

`tf_lossscale.LossScaleOptimizer(inner, ...)` builds the flavour that wraps
`inner`. Each flavour module defines its class as a subclass of this one
with `wraps=<predicate>`; `__init_subclass__` enters it in the registry
(`flavour_registry`) of its nearest public ancestor (this class, or
`experimental.LossScaleOptimizer` for the deprecated twins), and `__new__`
picks the first registered flavour whose predicate accepts `inner`. This
module imports no flavour.

Shared here, so that no flavour writes them again:

- the attributes `dynamic`, `dynamic_counter`, `dynamic_growth_steps`,
  `initial_scale`, `loss_scale`, `skipped_steps` and the knobs;
- `get_scaled_loss` / `get_unscaled_gradients`, with `GradientMarks`
  (`gradient_marks`), which tells `apply_gradients` whether its gradients
  are scaled;
- `get_config` / `from_config`.

Beside it: `InnerAttribute` (`inner_attribute`), a hyperparameter read and
written on the inner optimizer, and `check_gradients` (`gradient_check`).

The step itself is `step.loss_scaled_step`. The methods a traced step
calls are `tf.autograph.experimental.do_not_convert`: they hold no
data-dependent Python control flow (branches are explicit `tf.cond`s), and
AutoGraph converting them cost about 2 s on the first call of a process.
"""

from __future__ import annotations

import inspect
from typing import (
    Any,
    Callable,
    ClassVar,
    Dict,
    List,
    Mapping,
    Optional,
    Sequence,
    Type,
    Union,
    cast,
)

import tensorflow as tf

from tf_lossscale import (
    config_conversion,
    distribute,
    flavour_registry,
    skip_record,
    state_machine,
)
from tf_lossscale import finite as finite_lib
from tf_lossscale import settings as settings_lib
from tf_lossscale import step as step_lib

# Re-exported: the flavours and tests reach them through this module.
from tf_lossscale.flavour_registry import (  # noqa: F401
    _REGISTRY,
    Predicate,
    add_flavour_loader,
    legacy_keras_requested,
    reject_loss_scale_optimizer,
    wrong_family,
)
from tf_lossscale.gradient_check import (
    check_gradients,
    check_loss,
    checked_sparse_rows,
)
from tf_lossscale.gradient_marks import GradientMarks, Taken
from tf_lossscale.inner_attribute import InnerAttribute
from tf_lossscale.telemetry import Telemetry

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


class LossScaleOptimizer:
    """An optimizer that scales the loss so float16 gradients do not underflow.

    Wraps a Keras 3 or a tf_keras optimizer (of either tf_keras family) and
    builds the flavour for its type.

    Dynamic scaling (the default) starts at `initial_scale` (`2**15`) and, per
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

    The rule that tells them apart (the custom-loops guide states it) is
    decided in Python when the step runs eagerly or is traced, so it costs
    nothing per step inside a `tf.function`.

    Args:
      inner_optimizer: the optimizer to wrap (not a LossScaleOptimizer).
      dynamic: True for dynamic loss scaling, False for a fixed scale.
      initial_scale: the first scale: a finite number > 0, default `2**15`,
        when dynamic; the fixed scale, a number >= 1 and required, when not.
      dynamic_growth_steps: an int >= 1, default 2000, when dynamic; must
        be None when not.
      name: the optimizer's name (default: the original's).
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
      max_consecutive_skips: None (default: never stop), or an int >= 1:
        the step that completes that many skipped steps in a row raises
        `SkipStreakError` naming the variables and the scale (see
        `stop`); with a fixed scale too.
      save_telemetry: False (default: checkpoints hold the originals' keys
        only), or True: `skipped_steps` and the record of the run of
        skipped steps are saved and restored with `tf.train.Checkpoint`,
        under the inner optimizer's `loss_scale_telemetry` child, and in
        the model files that keep the optimizer's state (Keras 3's
        `.keras`: `keras_telemetry_file`; tf_keras: see `variables`).
      **kwargs: Keras' base-optimizer arguments, which the Keras 3 flavour
        accepts at their defaults only, as Keras' own class does (set them
        on the inner optimizer); any other keyword is refused.

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
    _telemetry: Telemetry
    iterations: Any  # The inner optimizer's (each flavour's Keras says).
    _untracked: "_Untracked"
    inner_optimizer: Any
    """The wrapped optimizer. Its hyperparameters (`learning_rate`,
    `momentum`, ...) read and write through the wrapper too."""

    def __init_subclass__(cls, wraps: Optional[Predicate] = None,
                          flavour_part: bool = False, **kwargs: Any) -> None:
        # `wraps`: a flavour, which wraps what the predicate accepts.
        # `flavour_part`: a base that flavours build on, never built alone.
        super().__init_subclass__(**kwargs)
        public = next(base for base in cls.__mro__[1:]
                      if base.__dict__.get("_PICKS_FLAVOUR", False))
        if wraps is not None:
            flavour_registry.register(public, wraps, cls)
        elif not (flavour_part or cls.__dict__.get("_PICKS_FLAVOUR", False)
                  or flavour_registry.is_flavour(cls)):
            # A subclass that names no flavour (a user's, or a legacy
            # class of the shim) picks one as its parent does.
            cls._PICKS_FLAVOUR = True
            flavour_registry.derive(cls, public)

    def __new__(cls, *args: Any, **kwargs: Any) -> "LossScaleOptimizer":
        if cls.__dict__.get("_PICKS_FLAVOUR", False):
            inner = args[0] if args else kwargs.get(cls._INNER_ARGUMENT)
            cls = cls._flavour_for(inner)
        return super().__new__(cls)

    def __init__(self, inner_optimizer: Any, dynamic: bool = True,
                 initial_scale: Optional[float] = None,
                 dynamic_growth_steps: Optional[int] = None,
                 name: Optional[str] = None, *, min_scale: float = 1.0,
                 max_scale: Optional[float] = None,
                 growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 hysteresis: int = 1,
                 max_consecutive_skips: Optional[int] = None,
                 save_telemetry: bool = False, **kwargs: Any) -> None:
        # The one constructor every flavour runs. The knobs' defaults are
        # settings' tables' (tests/test_public_api.py holds them equal).
        self._check_inner(inner_optimizer)
        settings = settings_lib.check_settings(
            dynamic, initial_scale, dynamic_growth_steps,
            min_scale=min_scale, max_scale=max_scale,
            growth_factor=growth_factor, backoff_factor=backoff_factor,
            hysteresis=hysteresis,
            max_consecutive_skips=max_consecutive_skips,
            save_telemetry=save_telemetry)
        self._check_other_arguments(kwargs)
        distribute.check_supported_strategy("LossScaleOptimizer")
        self._build(inner_optimizer, settings, name)

    def _check_inner(self, inner_optimizer: Any) -> None:
        """Raises unless this flavour wraps `inner_optimizer`."""
        raise NotImplementedError(
            f"{type(self).__name__} is not a flavour of LossScaleOptimizer.")

    def _check_other_arguments(self, others: Dict[str, Any]) -> None:
        """Refuses keyword arguments that are neither ours nor a knob."""
        if others:
            raise TypeError(
                f"LossScaleOptimizer got unexpected keyword arguments "
                f"{sorted(others)}; it takes inner_optimizer, dynamic, "
                "initial_scale, dynamic_growth_steps, name and the knobs "
                f"{list({**settings_lib.KNOB_DEFAULTS, **settings_lib.STOP_DEFAULTS})}.")

    def _build(self, inner_optimizer: Any, settings: settings_lib.Settings,
               name: Optional[str]) -> None:
        """Makes the flavour's state around the checked settings."""
        raise NotImplementedError

    @classmethod
    def _register_joined(cls, joined: type, derived: type) -> None:
        """Registers `joined` (a subclass `derived` joined with this
        flavour) with this flavour's Keras' serialization (a flavour says)."""

    @classmethod
    def _flavour_for(cls, inner_optimizer: Any
                     ) -> "Type[LossScaleOptimizer]":
        """The registered subclass of `cls` that wraps `inner_optimizer`."""
        flavour_registry.reject_loss_scale_optimizer(inner_optimizer)
        for attempt in range(2):
            for accepts, flavour in flavour_registry.flavours_of(cls):
                if accepts(inner_optimizer):
                    return flavour
            if attempt or not flavour_registry.load_flavours_for(
                    inner_optimizer):
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
            f"{inner_optimizer!r} of type {flavour_registry.type_name(inner_optimizer)}."
            f"{flavour_registry.frozen_keras_hint(inner_optimizer)}")

    def _init_loss_scaling(self, settings: settings_lib.Settings) -> None:
        """Stores the checked settings; every flavour's constructor calls it."""
        self._settings = settings
        self._marks = GradientMarks()
        self._telemetry = Telemetry(settings.max_consecutive_skips,
                                    settings.save_telemetry)

    def _set_scale_variables(self, variables: step_lib.ScaleVariables
                             ) -> None:
        """Keeps the variables the step advances, out of automatic tracking.

        A flavour tracks the checkpointed ones itself, under the original's
        keys; a tuple attribute would add keys of its own.
        """
        self._untracked = _Untracked(variables)
        self._telemetry.make_variables(variables.skipped)
        if self._telemetry.save:
            self._telemetry.track(self.inner_optimizer)

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

    # The telemetry (`telemetry.Telemetry`, held as `_telemetry`).

    @property
    def save_telemetry(self) -> bool:
        """Whether checkpoints hold `skipped_steps` and the skip run."""
        return self._telemetry.save

    @property
    def max_consecutive_skips(self) -> Optional[int]:
        """Skipped steps in a row after which a step raises (None: never)."""
        return self._telemetry.max_consecutive_skips

    @property
    def last_skip(self) -> Optional[skip_record.SkipRecord]:
        """The last skipped step: which gradients, when, where; or None.

        A frozen `SkipRecord`; `str()` of it reads `step 12 skipped on
        replica 0: Inf entered at dense in the backward pass (the loss was
        finite); 2 of 40 gradients non-finite in dense; scale 2^15`. Works after an eager step and after a
        `tf.function` step alike (one host read of a few scalars). Not
        saved in checkpoints.
        """
        return self._telemetry.last_skip()

    def raise_if_stuck(self) -> None:
        """Raises `SkipStreakError` if the last `max_consecutive_skips`
        steps were all skipped (does nothing when the knob is None).

        The step calls it itself when it runs eagerly; call it after a
        `jit_compile=True` step, where a graph check cannot raise.
        """
        self._telemetry.raise_if_stuck(
            lambda: self.iterations, lambda: self.loss_scale,
            self.min_scale if self.dynamic else None)

    def _skip_recorder(self, grads: List[Any], variables: List[Any]
                       ) -> Optional[Callable[..., Any]]:
        """The recorder of this step's skip branch (`Telemetry.recorder`)."""
        return self._telemetry.recorder(grads, variables,
                                        lambda: self.iterations)

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
        check_loss(loss)
        loss = tf.convert_to_tensor(loss)
        scaled = loss * tf.cast(self._current_scale(), loss.dtype)
        self._marks.scaled_loss(loss, scaled)
        return scaled

    @tf.autograph.experimental.do_not_convert
    def get_unscaled_gradients(self, grads: Sequence[Any]) -> List[Any]:
        """Returns the gradients divided by the loss scale.

        None entries stay None, `tf.IndexedSlices` stay sparse, every dtype
        is kept. The next `apply_gradients` here takes its gradients as
        unscaled, unless they are these very `grads`.
        """
        grads = list(grads)
        self._refuse_stale_traces()
        scale = self._current_scale()
        unscaled, finite = finite_lib.unscale_for_step(grads, scale)
        self._marks.unscaled(grads, unscaled, finite, scale)
        return unscaled

    def _decide(self, grads: Sequence[Any]) -> Taken:
        """What the marks say of the gradients `apply_gradients` got, with
        `scaled` decided by the flavour where no mark says (forgets them)."""
        taken = self._marks.take(grads)
        self._telemetry.note_loss(taken.loss)
        if taken.scaled is None:
            taken = taken._replace(
                scaled=self._unmarked_gradients_are_scaled())
            if taken.scaled:
                self._marks.defaulted_to_scaled()
        return taken

    def _refuse_stale_traces(self) -> None:
        """Raises if the first `get_unscaled_gradients` comes after a trace
        that took unmarked gradients as scaled.

        From now on unmarked gradients are taken as unscaled (the
        documented flow), but that trace decided otherwise when it was made
        and would keep dividing them by the loss scale: gradients unscaled
        and accumulated in one `tf.function` and applied in another that
        was traced first would be divided twice, silently.
        """
        if self._marks.ever_unscaled or not self._marks.traced_as_scaled:
            return
        raise RuntimeError(
            "get_unscaled_gradients was called on this LossScaleOptimizer "
            "for the first time after a tf.function had traced its "
            "apply_gradients with gradients that no scaling method marked; "
            "that trace took them as scaled (Keras 3's rule, which holds "
            "until get_unscaled_gradients first runs) and, called again, "
            "would divide unscaled gradients by the loss scale once more. "
            "Call get_unscaled_gradients (or trace the function that calls "
            "it) before the first apply_gradients is traced, or use "
            "tf_lossscale.compat.LossScaleOptimizer, which applies unmarked "
            "gradients as given (TF 2.4-2.15's rule).")

    def _unmarked_gradients_are_scaled(self) -> bool:
        """The flavour's default when neither scaling method ran here.

        Once `get_unscaled_gradients` has run on this optimizer, its user
        follows TensorFlow's documented flow, in which `apply_gradients`
        always takes unscaled gradients.
        """
        return (self._UNMARKED_GRADIENTS_ARE_SCALED
                and not self._marks.ever_unscaled)

    def _step(self, grads: List[Any], variables: List[Any], taken: Taken,
              keep: Optional[Sequence[bool]] = None) -> tf.Tensor:
        """`step.loss_scaled_step` with this optimizer's parts.

        Sparse gradients' rows are checked first, so that a step that
        raises on one changes nothing (`checked_sparse_rows`). Eagerly,
        with `max_consecutive_skips`, it raises `SkipStreakError` once a
        step completes a run of that many skipped steps.
        """
        grads, verdict = checked_sparse_rows(grads, variables, taken.verdict)
        rule = self._settings.rule() if self.dynamic else None
        finite = step_lib.loss_scaled_step(
            grads, scale=self._current_scale(),
            already_unscaled=not taken.scaled,
            apply=lambda g: self._apply_inner(g, variables),
            skip=self._skip_inner, variables=self._scale_variables,
            rule=rule, keep=keep, verdict=verdict,
            undivided=taken.undivided,
            record=self._skip_recorder(grads, variables),
            powers_of_two=state_machine.powers_of_two_only(
                rule, self._settings.initial_scale))
        if tf.executing_eagerly():
            self.raise_if_stuck()
        return finite

    def _apply_inner(self, grads: List[Any], variables: List[Any]) -> None:
        """Applies unscaled gradients with the inner optimizer."""
        raise NotImplementedError

    def _skip_inner(self) -> None:
        """Advances the inner optimizer's `iterations` by one, nothing else."""
        raise NotImplementedError

    # Serialization. Each flavour says which inner configs it reads
    # (`_reads`) and how (`_deserialize_inner`, `_serialize_inner`).

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

    def _serialize_inner(self) -> Dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def from_config(cls, config: Dict[str, Any],
                    custom_objects: Optional[Dict[str, Any]] = None
                    ) -> Any:
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
        flavour = cls._flavour_for_config(inner_config)
        inner = flavour._deserialize_inner(inner_config, custom_objects)
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
            for _, flavour in flavour_registry.flavours_of(cls):
                if cast("Type[LossScaleOptimizer]", flavour)._reads(
                        inner_config):
                    return flavour
            if attempt or not flavour_registry.load_flavours(None):
                break
        raise TypeError(
            "inner_optimizer must be the config of a Keras 3 or tf_keras "
            f"optimizer; got {inner_config!r}.")

    @classmethod
    def _reads(cls, inner_config: Dict[str, Any]) -> bool:
        """Whether this flavour deserializes `inner_config` (a flavour says)."""
        return False

    @classmethod
    def _deserialize_inner(cls, config: Any,
                           custom_objects: Optional[Dict[str, Any]]) -> Any:
        raise NotImplementedError

    @classmethod
    def _from_current_args(cls, inner_optimizer: Any,
                           args: Dict[str, Any]) -> Any:
        return cls(inner_optimizer, **args)


# `__new__` picks the flavour; what it accepts is the constructor's (the
# name aside, which only a flavour's signature shows).
LossScaleOptimizer.__new__.__signature__ = inspect.signature(  # type: ignore
    LossScaleOptimizer.__init__).replace(parameters=[
        p for p in inspect.signature(LossScaleOptimizer.__init__
                                     ).parameters.values()
        if p.name not in ("name", "kwargs")])
