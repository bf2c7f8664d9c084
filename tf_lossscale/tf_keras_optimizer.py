"""The tf_keras (Keras 2) flavour of `tf_lossscale.LossScaleOptimizer`.

`TfKerasLossScaleOptimizer` wraps an optimizer of tf_keras' default family
(`tf_keras.optimizers.Optimizer`: `tf_keras.optimizers.SGD`, `Adam`, ...).
It is a `tf_keras.optimizers.Optimizer`, so `model.compile` takes it, and a
`tf_keras.mixed_precision.LossScaleOptimizer`, so `compile` under the
`mixed_float16` policy keeps it as it is instead of wrapping it again.

Like tf_keras' own wrapper it is, to a checkpoint, its inner optimizer plus a
child `loss_scale` holding `current_loss_scale` and `good_steps`
(`DelegatingTrackableMixin`, `tf_keras_loss_scale_state`): a `tf.train.Checkpoint` written with tf_keras'
`LossScaleOptimizer`, or with the bare inner optimizer, restores into it and
back. Also like it, `apply_gradients` sums the gradients across replicas
before the finiteness check, and takes gradients as unscaled when neither
`get_scaled_loss` nor `get_unscaled_gradients` ran (with tf_keras' warning).
The step is `step.loss_scaled_step`, shared with every flavour.

`TfKerasExperimentalLossScaleOptimizer` is the deprecated
`experimental.LossScaleOptimizer(optimizer, loss_scale)` for tf_keras.

tf_keras' legacy family (`tf_keras.optimizers.legacy`, OptimizerV2) has its
own flavour, `tf_keras_legacy_optimizer`, which shares with this one what
tf_keras' two wrappers share: `tf_keras_checks` (`ScalingWarnings`, tf_keras'
warning when `apply_gradients` runs without the scaling methods;
`checked_pairs`; `reject_already_wrapped`) and `tf_keras_loss_scale_state`
(the `loss_scale` child and its checkpoint keys).
"""

from __future__ import annotations

import copy
from typing import Any, Dict, Iterable, List, Optional, Tuple

import tensorflow as tf
import tf_keras

from tf_lossscale import (
    _tf_private,
    distribute,
    eager_variables,
    experimental,
)
from tf_lossscale import optimizer as optimizer_lib
from tf_lossscale import settings as settings_lib
from tf_lossscale.optimizer import InnerAttribute
from tf_lossscale.tf_keras_checks import (
    ScalingWarnings,
    checked_pairs,
    reject_already_wrapped,
)
from tf_lossscale.tf_keras_loss_scale_state import track_loss_scale_state

__all__ = [
    "HYPERPARAMETERS",
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


def _type_name(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _check_inner(inner_optimizer: Any, flavour: type) -> None:
    """Raises unless `inner_optimizer` is a plain, unwrapped tf_keras one."""
    optimizer_lib.reject_loss_scale_optimizer(inner_optimizer)
    if not isinstance(inner_optimizer, tf_keras.optimizers.Optimizer):
        raise optimizer_lib.wrong_family(
            inner_optimizer, flavour,
            "only the optimizers subclassing from tf_keras.optimizers."
            "Optimizer (tf_keras' current family, which tf.keras.optimizers."
            "Optimizer is under TF_USE_LEGACY_KERAS=1) can be passed")
    reject_already_wrapped(inner_optimizer)


class _CallableList(list):
    """A list that calling returns: tf_keras' `variables` is read both ways."""

    def __call__(self) -> "_CallableList":
        return self


def _is_tf_keras_optimizer(inner_optimizer: Any) -> bool:
    return isinstance(inner_optimizer, tf_keras.optimizers.Optimizer)


_TfKerasLossScaleOptimizerV3: Any = _tf_private.tf_keras_loss_scale_optimizer_bases(
)[1]


class TfKerasLossScaleOptimizer(ScalingWarnings,
                                _TfKerasLossScaleOptimizerV3,
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

    It derives from tf_keras' own wrapper of this family (a private class)
    only so that `tf_keras.optimizers.convert_to_legacy_optimizer`, which
    tests `isinstance` with it, converts its inner optimizer too. Everything
    that class defines is overridden here, in `ScalingWarnings` or in
    `tf_lossscale.LossScaleOptimizer`, but `_apply_gradients` (which only
    its own `apply_gradients` calls).
    """

    # A plain attribute per instance; this shadows tf_keras' abstract
    # `inner_optimizer` property, which has no setter.
    inner_optimizer: Any = None

    def _check_inner(self, inner_optimizer: Any) -> None:
        _check_inner(inner_optimizer, type(self))

    @classmethod
    def _register_joined(cls, joined: type, derived: type) -> None:
        experimental.register_joined(tf_keras.saving, joined, derived, cls)

    @_tf_private.no_automatic_dependency_tracking
    def _build(self, inner_optimizer: Any, settings: settings_lib.Settings,
               name: Optional[str]) -> None:
        # Not tf_keras' Optimizer constructor: every variable (iterations,
        # slots) is the inner optimizer's, and so is every checkpoint key.
        _tf_private.DelegatingTrackableMixin.__init__(self, inner_optimizer)
        self.inner_optimizer = inner_optimizer
        self.name = name or "LossScaleOptimizer"
        self._init_loss_scaling(settings)
        variables = track_loss_scale_state(inner_optimizer, settings)
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
        load too. With `save_telemetry=True`, then the telemetry (see
        `Telemetry.by_key`), which those files keep then.
        """
        return _CallableList(
            list(self.inner_optimizer.variables) + self._saved_scale_variables())

    def _saved_scale_variables(self, telemetry: Optional[bool] = None
                               ) -> List[tf.Variable]:
        variables = self._scale_variables
        telemetry = self.save_telemetry if telemetry is None else telemetry
        return [v for v in (variables.scale, variables.good_steps)
                if v is not None] + (
            list(self._telemetry.by_key().values()) if telemetry else [])

    def build(self, var_list: Iterable[tf.Variable]) -> None:
        """Builds the inner optimizer's slots for `var_list`."""
        self.inner_optimizer.build(var_list)

    def set_weights(self, weights: List[Any]) -> None:
        """Sets `variables` from values (as h5 loading does).

        Also takes the inner optimizer's values alone (a file written with
        tf_keras' own wrapper or the bare optimizer; the scale stays then)
        and, with `save_telemetry=True`, those and the scale's without the
        telemetry (a file written without the option; the counters stay).

        Raises:
          ValueError: the count fits none of these.
        """
        inner_count = len(self.inner_optimizer.variables)
        weights = list(weights)
        counts = self._weight_counts()
        if len(weights) not in counts:
            raise ValueError(
                f"set_weights() got {len(weights)} values; this optimizer "
                f"takes {counts[1]} (its variables), {inner_count} (its "
                f"inner optimizer's alone) or {counts[2]} (its variables "
                "without the telemetry of save_telemetry=True).")
        self.inner_optimizer.set_weights(weights[:inner_count])
        for variable, value in zip(self._saved_scale_variables(),
                                   weights[inner_count:]):
            variable.assign(value)

    def _weight_counts(self) -> List[int]:
        """The numbers of values `set_weights` takes (see there)."""
        inner_count = len(self.inner_optimizer.variables)
        return [inner_count, len(self.variables),
                inner_count + len(self._saved_scale_variables(False))]

    def load_own_variables(self, store: Any) -> None:
        """Loads `variables` from a .keras file's store (see `set_weights`).

        A store of any other size is skipped with a warning, as tf_keras'
        optimizers do, and the model loads with fresh optimizer state.
        """
        values = [store[key] for key in sorted(store.keys(), key=int)]
        if len(values) not in self._weight_counts():
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

    @tf.autograph.experimental.do_not_convert
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

    @tf.autograph.experimental.do_not_convert
    def apply_gradients(self, grads_and_vars: Iterable[Tuple[Any, Any]],
                        name: Optional[str] = None,
                        skip_gradients_aggregation: bool = False,
                        **kwargs: Any) -> None:
        """Applies one step (or skips it); returns None, as tf_keras' does.

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
        # tf_keras refuses it here too (an optimizer made outside the scope).
        distribute.check_supported_strategy("LossScaleOptimizer")
        self._warn_about_scaling()
        pairs = checked_pairs(grads_and_vars)
        if not pairs:
            self._marks.take([])
            return None
        # The verdict was of the gradients before they are summed across
        # replicas: the step checks the sums again (unless summing passed
        # them on as they were: one replica).
        before = [g for g, _ in pairs]
        taken = self._decide(before)
        with tf.init_scope(), eager_variables.made_eagerly():
            # Slots exist before the first step, applied or skipped.
            self.inner_optimizer.build([v for _, v in pairs])
        if aggregate:
            pairs = self.inner_optimizer.aggregate_gradients(pairs)
        grads, variables = [g for g, _ in pairs], [v for _, v in pairs]
        taken = taken.summed(before, grads)
        with tf.name_scope(name or self.name):
            self._step(grads, variables, taken)
        return None

    @property
    def dynamic_counter(self) -> Optional[tf.Variable]:
        """The good-steps variable itself (None if not dynamic), as tf_keras'
        wrapper returns it: `opt.dynamic_counter.assign(0)` works."""
        return self._scale_variables.good_steps if self.dynamic else None

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
        # tf_keras writes `is_legacy_optimizer: False` into every config of
        # this family, and tf_keras' deserialize takes a config without it
        # (its legacy family, TF <= 2.10's optimizers) as a legacy one; those
        # are the legacy flavour's.
        flag = inner_config.get("config", {}).get("is_legacy_optimizer")
        return flag is False

    @classmethod
    def _deserialize_inner(cls, config: Any,
                           custom_objects: Optional[Dict[str, Any]]) -> Any:
        if not isinstance(config, dict):
            return config
        # tf_keras' deserialize edits the config it is given (it lowercases
        # class names): hand it a copy, so the caller's config stays.
        return tf_keras.optimizers.deserialize(
            copy.deepcopy(config), custom_objects=custom_objects)


for _name in HYPERPARAMETERS:
    setattr(TfKerasLossScaleOptimizer, _name, InnerAttribute(_name))
del _name


class TfKerasExperimentalLossScaleOptimizer(experimental.LossScaleOptimizer,
                                            TfKerasLossScaleOptimizer,
                                            wraps=_is_tf_keras_optimizer):
    """The deprecated optimizer wrapping a tf_keras optimizer."""


experimental.register_serializable(
    tf_keras.saving, TfKerasLossScaleOptimizer,
    TfKerasExperimentalLossScaleOptimizer,
    ("LossScaleOptimizer", "ExperimentalLossScaleOptimizer"))
