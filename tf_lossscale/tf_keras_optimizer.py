"""The tf_keras (Keras 2) flavour of `tf_lossscale.LossScaleOptimizer`.

`TfKerasLossScaleOptimizer` wraps an optimizer of tf_keras' default family
(`tf_keras.optimizers.Optimizer`: `tf_keras.optimizers.SGD`, `Adam`, ...).
It is a `tf_keras.optimizers.Optimizer`, so `model.compile` takes it, and a
`tf_keras.mixed_precision.LossScaleOptimizer`, so `compile` under the
`mixed_float16` policy keeps it as it is instead of wrapping it again.

Like tf_keras' own wrapper it is, to a checkpoint, its inner optimizer plus a
child `loss_scale` holding `current_loss_scale` and `good_steps`
(`DelegatingTrackableMixin`): a `tf.train.Checkpoint` written with tf_keras'
`LossScaleOptimizer`, or with the bare inner optimizer, restores into it and
back. Also like it, `apply_gradients` sums the gradients across replicas
before the finiteness check, and takes gradients as unscaled when neither
`get_scaled_loss` nor `get_unscaled_gradients` ran (with tf_keras' warning).
The step is `step.loss_scaled_step`, shared with every flavour.

`TfKerasExperimentalLossScaleOptimizer` is the deprecated
`experimental.LossScaleOptimizer(optimizer, loss_scale)` for tf_keras.

tf_keras' legacy family (`tf_keras.optimizers.legacy`, OptimizerV2) is not
supported: wrapping one raises a `TypeError` that names the replacement.
"""

from __future__ import annotations

import copy
from typing import Any, Dict, Iterable, List, Optional, Tuple

import tensorflow as tf
import tf_keras

from tf_lossscale import _tf_private
from tf_lossscale import distribute
from tf_lossscale import experimental
from tf_lossscale import optimizer as optimizer_lib
from tf_lossscale import settings as settings_lib
from tf_lossscale import step as step_lib
from tf_lossscale.optimizer import InnerAttribute

__all__ = [
    "HYPERPARAMETERS",
    "LossScaleState",
    "TfKerasExperimentalLossScaleOptimizer",
    "TfKerasLossScaleOptimizer",
]

# Attributes of tf_keras optimizers that read and write through to the inner
# optimizer: the base class's and those of every built-in optimizer.
HYPERPARAMETERS = (
    "amsgrad", "beta", "beta_1", "beta_2", "beta_2_decay", "centered",
    "clip_threshold", "clipnorm", "clipvalue", "ema_momentum",
    "ema_overwrite_frequency", "epsilon", "epsilon_1", "epsilon_2",
    "global_clipnorm", "initial_accumulator_value", "jit_compile",
    "l1_regularization_strength", "l2_regularization_strength",
    "l2_shrinkage_regularization_strength", "learning_rate",
    "learning_rate_power", "momentum", "nesterov", "relative_step", "rho",
    "use_ema", "weight_decay",
)

_LEGACY_FAMILY_MESSAGE = (
    "tf_lossscale.LossScaleOptimizer does not support tf_keras' legacy "
    "optimizers (tf_keras.optimizers.legacy.*, OptimizerV2); got {inner!r} "
    "of type {type}. Use the optimizer of the same name from "
    "tf_keras.optimizers (for example tf_keras.optimizers.SGD), which is "
    "tf_keras' default family.")


def _type_name(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _reject_legacy_family(inner_optimizer: Any) -> None:
    """Raises `TypeError` for an optimizer of tf_keras' legacy family."""
    if isinstance(inner_optimizer, tf_keras.optimizers.legacy.Optimizer):
        raise TypeError(_LEGACY_FAMILY_MESSAGE.format(
            inner=inner_optimizer, type=_type_name(inner_optimizer)))


def _current_family_config(config: Dict[str, Any]) -> Dict[str, Any]:
    """An optimizer config from before tf_keras 2.11, for today's family.

    Configs written before the current family existed (TF <= 2.10, such as
    the `optimizer` entry of a TF 2.3 LossScaleOptimizer config) carry
    neither an `is_legacy_optimizer` key nor a `module`, and tf_keras would
    load them as legacy optimizers. (Today's legacy optimizers write
    `module: keras.optimizers.legacy`; those stay legacy.) They name the
    same optimizer with the same arguments in the current family, except
    `decay`, which it lacks: 0 (the default) is dropped, anything else
    cannot be converted. Any other config is returned as it is.

    Raises:
      ValueError: the config has a non-zero `decay`.
    """
    args = config.get("config")
    if not isinstance(args, dict) or not args or (
            "is_legacy_optimizer" in args or "module" in config):
        return config
    decay = args.pop("decay", 0.0)
    if decay != 0:
        raise ValueError(
            "The inner optimizer config predates tf_keras' current "
            f"optimizers and has decay={decay!r}, which they lack; got "
            f"{config!r}. Use a LearningRateSchedule instead of decay.")
    args["is_legacy_optimizer"] = False
    return config


def _check_inner(inner_optimizer: Any) -> None:
    """Raises unless `inner_optimizer` is a plain, unwrapped tf_keras one."""
    optimizer_lib.reject_loss_scale_optimizer(inner_optimizer)
    _reject_legacy_family(inner_optimizer)
    if not isinstance(inner_optimizer, tf_keras.optimizers.Optimizer):
        raise TypeError(
            "inner_optimizer must be a tf_keras optimizer (an instance of "
            f"tf_keras.optimizers.Optimizer); got {inner_optimizer!r} of "
            f"type {_type_name(inner_optimizer)}.")
    if _tf_private.is_wrapped_by_loss_scale_optimizer(inner_optimizer):
        raise ValueError(
            "inner_optimizer is already wrapped by a LossScaleOptimizer; a "
            "tf_keras optimizer can be wrapped by only one, because the "
            "wrapper writes its loss scale into the inner optimizer's "
            f"checkpoint. Got {inner_optimizer!r}; wrap a new optimizer.")


class _CallableList(list):
    """A list that calling returns: tf_keras' `variables` is read both ways."""

    def __call__(self) -> "_CallableList":
        return self


class LossScaleState(tf.Module):
    """The dynamic loss scale's variables, under TensorFlow's checkpoint keys.

    `current_loss_scale` (float32) and `good_steps` (int64) are the names
    tf_keras' and TensorFlow's loss scales write, so checkpoints interchange;
    `bad_steps` exists only with hysteresis. All aggregate with NONE: every
    replica assigns the same agreed value.
    """

    def __init__(self, initial_scale: float, hysteresis: bool) -> None:
        super().__init__(name="loss_scale")
        self.current_loss_scale = self._variable(
            initial_scale, tf.float32, "current_loss_scale")
        self.good_steps = self._variable(0, tf.int64, "good_steps")
        if hysteresis:
            self.bad_steps = self._variable(0, tf.int64, "bad_steps")

    @staticmethod
    def _variable(value: Any, dtype: tf.DType, name: str) -> tf.Variable:
        return tf.Variable(
            value, dtype=dtype, name=name, trainable=False,
            synchronization=tf.VariableSynchronization.AUTO,
            aggregation=tf.VariableAggregation.NONE)


def _is_tf_keras_optimizer(inner_optimizer: Any) -> bool:
    return isinstance(inner_optimizer, tf_keras.optimizers.Optimizer)


class TfKerasLossScaleOptimizer(optimizer_lib.LossScaleOptimizer,
                                _tf_private.DelegatingTrackableMixin,
                                tf_keras.optimizers.Optimizer,
                                tf_keras.mixed_precision.LossScaleOptimizer,
                                wraps=_is_tf_keras_optimizer):
    """`tf_lossscale.LossScaleOptimizer` for tf_keras optimizers.

    See `tf_lossscale.LossScaleOptimizer` for the arguments, the skip rule
    and how `apply_gradients` tells scaled from unscaled gradients. `minimize`
    and `compute_gradients` (which `fit` uses) scale the loss and unscale the
    gradients themselves. Create it in the scope of the distribution strategy
    that trains with it, as any tf_keras optimizer.
    """

    # A plain attribute per instance; this shadows tf_keras' abstract
    # `inner_optimizer` property, which has no setter.
    inner_optimizer = None

    # tf_keras' apply_gradients takes unmarked gradients as unscaled.
    _UNMARKED_GRADIENTS_ARE_SCALED = False

    @_tf_private.no_automatic_dependency_tracking
    def __init__(self, inner_optimizer: tf_keras.optimizers.Optimizer,
                 dynamic: bool = True, initial_scale: Optional[float] = None,
                 dynamic_growth_steps: Optional[int] = None,
                 name: Optional[str] = None, *, min_scale: float = 1.0,
                 max_scale: Optional[float] = None,
                 growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 hysteresis: int = 1) -> None:
        _check_inner(inner_optimizer)
        settings = settings_lib.check_settings(
            dynamic, initial_scale, dynamic_growth_steps,
            min_scale=min_scale, max_scale=max_scale,
            growth_factor=growth_factor, backoff_factor=backoff_factor,
            hysteresis=hysteresis)
        distribute.check_supported_strategy("LossScaleOptimizer")
        # Not tf_keras' Optimizer constructor: every variable (iterations,
        # slots) is the inner optimizer's, and so is every checkpoint key.
        _tf_private.DelegatingTrackableMixin.__init__(self, inner_optimizer)
        self.inner_optimizer = inner_optimizer
        self.name = name or "LossScaleOptimizer"
        self._init_loss_scaling(settings)
        variables = _track_state(inner_optimizer, settings)
        self._set_scale_variables(variables)
        if settings.dynamic:  # The names of the Keras 3 flavour's variables.
            self.dynamic_scale = variables.scale
            self.step_counter = variables.good_steps
        _tf_private.mark_wrapped_by_loss_scale_optimizer(inner_optimizer)

    # tf_keras' Optimizer API, served by the inner optimizer.

    @property
    def iterations(self) -> tf.Variable:
        """The inner optimizer's step count; advances on skipped steps too."""
        return self.inner_optimizer.iterations

    @iterations.setter
    def iterations(self, variable: tf.Variable) -> None:
        self.inner_optimizer.iterations = variable

    @property
    def variables(self) -> List[tf.Variable]:
        """The inner optimizer's variables, then the scale and the counter.

        In that order, so that h5 and .keras files keep the loss scale, and
        the inner optimizer's variables keep their positions: files written
        with tf_keras' own wrapper (which saves only the inner optimizer's)
        load too.
        """
        return _CallableList(
            list(self.inner_optimizer.variables) + self._saved_scale_variables())

    def _saved_scale_variables(self) -> List[tf.Variable]:
        variables = self._scale_variables
        return [v for v in (variables.scale, variables.good_steps)
                if v is not None]

    def build(self, var_list: Iterable[tf.Variable]) -> None:
        """Builds the inner optimizer's slots for `var_list`."""
        self.inner_optimizer.build(var_list)

    def set_weights(self, weights: List[Any]) -> None:
        """Sets `variables` from values (as h5 loading does).

        Also takes the inner optimizer's values alone (a file written with
        tf_keras' own wrapper or the bare optimizer); the scale stays then.

        Raises:
          ValueError: the count fits neither.
        """
        inner_count = len(self.inner_optimizer.variables)
        weights = list(weights)
        if len(weights) not in (inner_count, len(self.variables)):
            raise ValueError(
                f"set_weights() got {len(weights)} values; this optimizer "
                f"takes {len(self.variables)} (its variables) or "
                f"{inner_count} (its inner optimizer's alone).")
        self.inner_optimizer.set_weights(weights[:inner_count])
        for variable, value in zip(self._saved_scale_variables(),
                                   weights[inner_count:]):
            variable.assign(value)

    def load_own_variables(self, store: Any) -> None:
        """Loads `variables` from a .keras file's store (see `set_weights`).

        A store of any other size is skipped with a warning, as tf_keras'
        optimizers do, and the model loads with fresh optimizer state.
        """
        values = [store[key] for key in sorted(store.keys(), key=int)]
        if len(values) not in (len(self.inner_optimizer.variables),
                               len(self.variables)):
            tf.get_logger().warning(
                "Skipping the optimizer state of %r: the file holds %d "
                "values, this optimizer has %d variables.", self.name,
                len(values), len(self.variables))
            return
        self.set_weights(values)

    def finalize_variable_values(self, var_list: List[tf.Variable]) -> None:
        """The inner optimizer's end-of-training step (EMA overwrite)."""
        self.inner_optimizer.finalize_variable_values(var_list)

    def exclude_from_weight_decay(self, var_list=None, var_names=None):
        """Excludes variables from the inner optimizer's weight decay."""
        self.inner_optimizer.exclude_from_weight_decay(
            var_list=var_list, var_names=var_names)

    # The step.

    def compute_gradients(self, loss: optimizer_lib.Loss, var_list: Any,
                          tape: Optional[tf.GradientTape] = None
                          ) -> List[Tuple[Any, Any]]:
        """Unscaled gradients of `loss`, computed from the scaled loss.

        tf_keras' `minimize` (and so `fit`) calls this and then
        `apply_gradients`, which takes these gradients as unscaled.
        """
        tape = tape if tape is not None else tf.GradientTape()
        with tape:
            scaled_loss = self.get_scaled_loss(loss)
        pairs = self.inner_optimizer.compute_gradients(
            scaled_loss, var_list, tape=tape)
        grads = self.get_unscaled_gradients([g for g, _ in pairs])
        return list(zip(grads, [v for _, v in pairs]))

    def apply_gradients(self, grads_and_vars: Iterable[Tuple[Any, Any]],
                        name: Optional[str] = None,
                        skip_gradients_aggregation: bool = False,
                        **kwargs: Any) -> tf.Variable:
        """Applies one step (or skips it); returns `iterations`.

        The gradients are summed across replicas first (unless
        `skip_gradients_aggregation`), as tf_keras does. Whether they are
        taken as scaled or already unscaled is the rule of
        `tf_lossscale.LossScaleOptimizer`. None gradients are left out.

        Raises:
          ValueError: called in a cross-replica context, every gradient is
            None, or a gradient's shape does not fit its variable.
          TypeError: a gradient is not floating point. Nothing changes then.
        """
        aggregate = (not skip_gradients_aggregation
                     and kwargs.pop("experimental_aggregate_gradients", True))
        if kwargs:
            raise TypeError(
                f"apply_gradients() got unexpected arguments {sorted(kwargs)};"
                " it takes grads_and_vars, name, skip_gradients_aggregation "
                "and experimental_aggregate_gradients.")
        pairs = self._checked_pairs(grads_and_vars)
        if not pairs:
            self._marks.take([])
            return self.iterations
        already_unscaled = self._already_unscaled([g for g, _ in pairs])
        with tf.init_scope():
            # Slots exist before the first step, applied or skipped.
            self.inner_optimizer.build([v for _, v in pairs])
        if aggregate:
            pairs = self.inner_optimizer.aggregate_gradients(pairs)
        grads, variables = [g for g, _ in pairs], [v for _, v in pairs]
        with tf.name_scope(name or self.name):
            self._step(grads, variables, already_unscaled)
        return self.iterations

    def _checked_pairs(self, grads_and_vars: Iterable[Tuple[Any, Any]]
                       ) -> List[Tuple[Any, Any]]:
        """The pairs that have a gradient; raises on bad input."""
        distribute.require_replica_context("apply_gradients()")
        pairs = list(grads_and_vars)
        kept = [(g, v) for g, v in pairs if g is not None]
        if pairs and not kept:
            raise ValueError(
                "No gradients provided for any variable: every gradient is "
                f"None for {[v.name for _, v in pairs]}.")
        optimizer_lib.check_gradients(
            [g for g, _ in kept], [v for _, v in kept])
        return kept

    def _unmarked_gradients_are_scaled(self) -> bool:
        _tf_private.tf_logging_warning(
            "You forgot to call LossScaleOptimizer.get_scaled_loss() and "
            "LossScaleOptimizer.get_unscaled_gradients() before calling "
            "LossScaleOptimizer.apply_gradients(). This will likely result in "
            "worse model quality, so please call them in the correct places! "
            "For example:\n  with tf.GradientTape() as tape:\n"
            "    loss = opt.get_scaled_loss(loss)\n"
            "  grads = tape.gradient(loss, vars)\n"
            "  grads = opt.get_unscaled_gradients(grads)\n"
            "  opt.apply_gradients(zip(grads, vars))\n"
            "The gradients are applied as they are, unscaled, as tf_keras "
            "does.")
        return False

    # The parts `optimizer_lib.LossScaleOptimizer._step` is handed.

    def _apply_inner(self, grads: List[Any], variables: List[Any]) -> None:
        # Already summed across replicas (or the caller chose not to).
        self.inner_optimizer.apply_gradients(
            list(zip(grads, variables)), skip_gradients_aggregation=True)

    def _skip_inner(self) -> None:
        self.inner_optimizer.iterations.assign_add(1, read_value=False)

    def _serialize_inner(self) -> Dict[str, Any]:
        return tf_keras.optimizers.serialize(self.inner_optimizer)

    @classmethod
    def _reads(cls, inner_config: Dict[str, Any]) -> bool:
        # tf_keras writes `is_legacy_optimizer` (False for this family) into
        # every optimizer config; a config without it is a TF <= 2.3 one,
        # tf_keras' when tf.keras is tf_keras in this process.
        flag = inner_config.get("config", {}).get("is_legacy_optimizer")
        return flag is False or (
            flag is None and optimizer_lib.legacy_keras_requested())

    @classmethod
    def _deserialize_inner(cls, config: Any,
                           custom_objects: Optional[Dict[str, Any]]) -> Any:
        if not isinstance(config, dict):
            return config
        # tf_keras' deserialize edits the config it is given (it lowercases
        # class names): hand it a copy, so the caller's config stays.
        return tf_keras.optimizers.deserialize(
            _current_family_config(copy.deepcopy(config)),
            custom_objects=custom_objects)


for _name in HYPERPARAMETERS:
    setattr(TfKerasLossScaleOptimizer, _name, InnerAttribute(_name))
del _name


tf_keras.saving.register_keras_serializable(
    package="tf_lossscale", name="LossScaleOptimizer")(TfKerasLossScaleOptimizer)


@tf_keras.saving.register_keras_serializable(
    package="tf_lossscale", name="ExperimentalLossScaleOptimizer")
class TfKerasExperimentalLossScaleOptimizer(experimental.LossScaleOptimizer,
                                            TfKerasLossScaleOptimizer,
                                            wraps=_is_tf_keras_optimizer):
    """The deprecated optimizer wrapping a tf_keras optimizer."""


def _track_state(inner_optimizer: Any, settings: settings_lib.Settings
                 ) -> step_lib.ScaleVariables:
    """Creates the scale's variables; the checkpointed ones under the inner
    optimizer's `loss_scale` child (we are the inner optimizer, to a
    checkpoint), as tf_keras' wrapper does."""
    skipped = optimizer_lib.skipped_steps_variable()
    if not settings.dynamic:
        return step_lib.ScaleVariables(skipped=skipped)
    state = LossScaleState(settings.initial_scale,
                           settings.rule().needs_bad_steps)
    _tf_private.track_child(inner_optimizer, state, "loss_scale")
    return step_lib.ScaleVariables(
        state.current_loss_scale, state.good_steps,
        getattr(state, "bad_steps", None), skipped)
