"""The Keras 3 flavour of `tf_lossscale.LossScaleOptimizer`, and its twin.

`KerasLossScaleOptimizer` is also a `keras.mixed_precision.LossScaleOptimizer`,
so `model.compile` under the `mixed_float16` policy keeps it as it is, and it
uses Keras' own variable names (`dynamic_scale`, `step_counter`, under the
attribute `inner_optimizer`), so a `tf.train.Checkpoint` written with Keras'
optimizer restores into it. What it does differently from Keras' (docs/differences.md
section 0): replicas agree on the verdict before any variable changes, a
non-finite step is skipped with a fixed scale too, `iterations` advances on
skipped steps, the scale has a floor and never grows to inf, `dynamic=False`
works, and the documented `get_scaled_loss` / `get_unscaled_gradients` flow
works beside `scale_loss`. Its constructor reads Keras 3 code's positionals
too and refuses Keras' base-optimizer arguments: `keras_arguments`.

`KerasExperimentalLossScaleOptimizer` is the deprecated
`experimental.LossScaleOptimizer(optimizer, loss_scale)` for Keras 3.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any, Dict, Iterable, List, Optional, Tuple

import keras
import tensorflow as tf

from tf_lossscale import (
    _tf_private,
    distribute,
    eager_variables,
    experimental,
    gradient_check,
    keras_arguments,
    keras_telemetry_file,
)
from tf_lossscale import finite as finite_lib
from tf_lossscale import optimizer as optimizer_lib
from tf_lossscale import settings as settings_lib
from tf_lossscale import step as step_lib
from tf_lossscale.optimizer import InnerAttribute

__all__ = [
    "HYPERPARAMETERS",
    "UnbuiltApplyError",
    "KerasExperimentalLossScaleOptimizer",
    "KerasLossScaleOptimizer",
]

# Hyperparameters of Keras 3's optimizers that read and write through to the
# inner optimizer (`learning_rate` too, through Keras' own property). The
# clipping, weight-decay and EMA ones are set by Keras' base constructor on
# the wrapper as well, where nothing reads them: `InnerAttribute` drops those
# writes.
HYPERPARAMETERS = (
    "amsgrad", "beta", "beta_1", "beta_2", "centered", "clipnorm",
    "clipvalue", "ema_momentum", "ema_overwrite_frequency", "epsilon",
    "global_clipnorm", "initial_accumulator_value",
    "l1_regularization_strength", "l2_regularization_strength",
    "l2_shrinkage_regularization_strength", "learning_rate_power",
    "momentum", "nesterov", "rho", "use_ema", "weight_decay",
)


class UnbuiltApplyError(ValueError, TypeError):
    """`apply(grads)` without variables on an optimizer that is not built.

    A ValueError, as this package raises for bad input, and a TypeError, as
    Keras 3 raises there.
    """

    # Rebuildable by AutoGraph, so `tf.function` callers see this type
    # (see `distribute.ReplicaContextError`).
    __init__ = Exception.__init__


def _is_keras3_optimizer(inner_optimizer: Any) -> bool:
    return isinstance(inner_optimizer, keras.optimizers.Optimizer)


def _variables(var_list: Any) -> List[Any]:
    """`minimize`'s variables as a list (one variable, or a nest of them);
    raises `NotAVariableError` on what cannot be trained."""
    variables = tf.nest.flatten(var_list)
    gradient_check.check_variables(variables)
    return variables


def _check_inner(inner_optimizer: Any, flavour: type) -> None:
    """Raises unless `inner_optimizer` is a plain Keras 3 optimizer."""
    optimizer_lib.reject_loss_scale_optimizer(inner_optimizer)
    if not _is_keras3_optimizer(inner_optimizer):
        raise optimizer_lib.wrong_family(
            inner_optimizer, flavour,
            "only Keras 3 optimizers (instances of keras.optimizers."
            "Optimizer, which is tf.keras.optimizers.Optimizer on TensorFlow "
            ">= 2.16) can be passed")


class KerasLossScaleOptimizer(optimizer_lib.LossScaleOptimizer,
                              keras.mixed_precision.LossScaleOptimizer,
                              wraps=_is_keras3_optimizer):
    """`tf_lossscale.LossScaleOptimizer` for Keras 3 optimizers.

    See `tf_lossscale.LossScaleOptimizer` for the arguments, the skip rule
    and how `apply_gradients` tells scaled from unscaled gradients.
    `minimize(loss, var_list, tape=None)` is TensorFlow's: it scales the
    loss, unscales the gradients and applies them.
    """

    def __init__(self, inner_optimizer: keras.optimizers.Optimizer,
                 *args: Any, **kwargs: Any) -> None:
        # TensorFlow's signature (the public constructor's), or Keras 3's
        # positionals, read as their authors meant.
        super().__init__(inner_optimizer,
                         **keras_arguments.bind_positionals(args, kwargs))

    def _check_inner(self, inner_optimizer: Any) -> None:
        _check_inner(inner_optimizer, type(self))

    @classmethod
    def _register_joined(cls, joined: type, derived: type) -> None:
        experimental.register_joined(keras.saving, joined, derived, cls)

    def _check_other_arguments(self, others: Dict[str, Any]) -> None:
        # Keras' base-optimizer arguments, refused as Keras' class does.
        keras_arguments.check_base_arguments(others)

    def _build(self, inner_optimizer: Any, settings: settings_lib.Settings,
               name: Optional[str]) -> None:
        # Keras' base constructor, not Keras' LossScaleOptimizer's, which
        # rejects dynamic=False and stores plain attributes. One default
        # name (not auto-numbered), so equal optimizers have equal configs.
        keras.optimizers.Optimizer.__init__(
            self, learning_rate=0.0, name=name or "loss_scale_optimizer")
        self._init_loss_scaling(settings)
        self.inner_optimizer = inner_optimizer
        # As Keras' class does: the wrapper scales the loss, not the inner.
        inner_optimizer.loss_scale_factor = None
        self._set_scale_variables(self._make_variables(settings))

    def _make_variables(self, settings: settings_lib.Settings
                        ) -> step_lib.ScaleVariables:
        skipped = optimizer_lib.skipped_steps_variable()
        if not settings.dynamic:
            return step_lib.ScaleVariables(skipped=skipped)
        # Keras' names and order, for checkpoints written by its class.
        self.step_counter = self.add_variable(
            shape=(), dtype="int64", initializer="zeros",
            aggregation="none", name="step_counter")
        initial = keras.initializers.Constant(settings.initial_scale)
        self.dynamic_scale = self.add_variable(
            shape=(), dtype="float32", initializer=initial,
            aggregation="none", name="dynamic_scale")
        bad_steps = None
        if settings.rule().needs_bad_steps:
            bad_steps = self.add_variable(
                shape=(), dtype="int64", initializer="zeros",
                aggregation="none", name="bad_steps")
        return step_lib.ScaleVariables(
            self.dynamic_scale, self.step_counter, bad_steps, skipped)

    def build(self, var_list: List[Any]) -> None:
        """Builds the inner optimizer (if it is not yet) on `var_list`."""
        if not self.inner_optimizer.built:
            self.inner_optimizer.build(var_list)
        keras.optimizers.Optimizer.build(self, var_list)

    @property
    def _loss_scale_telemetry(self) -> Optional[Any]:
        """What Keras saves beside the optimizer's variables in `.keras`
        files: the telemetry with `save_telemetry=True`, else None."""
        return self._telemetry.file_entry(keras_telemetry_file.TelemetryEntry)

    # Keras 3's API.

    @tf.autograph.experimental.do_not_convert
    def scale_loss(self, loss: tf.Tensor) -> tf.Tensor:
        """`loss` times the scale, with Keras 3's dtype rule; `fit` calls it.

        As Keras 3 multiplies: once built, by the float32 scale variable, so
        a float16 loss gives a float32 scaled loss (`4.0 * 2**15` is 131072,
        not float16's inf); before, in the loss's dtype, as Keras 3's
        Python number does. Unlike Keras 3, the value is the current scale
        even then (ours exists from construction): a step traced before
        `build` must not bake the initial scale into its graph.
        `get_scaled_loss` (TensorFlow's) keeps the loss's dtype always.
        """
        scale = self._current_scale()
        dtype = tf.convert_to_tensor(loss).dtype
        if not self.built and dtype.is_floating:
            scale = tf.cast(scale, dtype)
        scaled = keras.ops.multiply(loss, scale)
        self._marks.scaled_loss(loss, scaled)
        return scaled

    @tf.autograph.experimental.do_not_convert
    def check_finite(self, grads: Iterable[Any]) -> tf.Tensor:
        """A scalar bool tensor: True iff no gradient holds NaN or Inf."""
        return finite_lib.all_finite(list(grads))

    @tf.autograph.experimental.do_not_convert
    def apply_gradients(self, grads_and_vars: Iterable[Tuple[Any, Any]],
                        name: Optional[str] = None,
                        skip_gradients_aggregation: bool = False,
                        **kwargs: Any) -> Any:
        """Applies one step (or skips it); returns `iterations`.

        Whether the gradients are taken as scaled or as already unscaled
        follows the rule the class docstring describes. `skip_gradients_aggregation=True` /
        `experimental_aggregate_gradients=False` (TF 2.4-2.15's spellings)
        say the gradients are already summed across replicas, as there.
        """
        del name
        aggregate = (not skip_gradients_aggregation
                     and kwargs.pop("experimental_aggregate_gradients", True))
        if kwargs:
            raise TypeError(
                f"apply_gradients() got unexpected arguments {sorted(kwargs)};"
                " it takes grads_and_vars, name, skip_gradients_aggregation "
                "and experimental_aggregate_gradients.")
        pairs = list(grads_and_vars)
        if not pairs:
            self._marks.take([])
            return self.iterations
        grads, variables = zip(*pairs)
        if aggregate:
            self.apply(list(grads), list(variables))
        else:
            with _tf_private.keras_gradients_already_summed(
                    self.inner_optimizer):
                self.apply(list(grads), list(variables))
        return self.iterations

    @tf.autograph.experimental.do_not_convert
    def apply(self, grads: Iterable[Any],
              trainable_variables: Optional[Iterable[Any]] = None) -> None:
        """Applies one step (or skips it), Keras 3's signature.

        Raises:
          ValueError: called in a cross-replica context, unbuilt without
            variables, gradients and variables of different lengths, no
            gradient at all, a gradient of the wrong shape, or variables it
            was not built with. Nothing changes then.
          TypeError: a gradient is not floating point.
        """
        grads = list(grads)
        if not grads:
            self._marks.take([])
            return
        variables = self._variables_for(grads, trainable_variables)
        if not self.built:
            eager_variables.build(lambda: self.build(variables))
        _tf_private.keras_check_variables_are_known(self, variables)
        taken = self._decide(grads)
        keep = [bool(getattr(v, "overwrite_with_gradient", False))
                for v in variables]
        self._step(grads, variables, taken, keep)

    def _variables_for(self, grads: List[Any],
                       trainable_variables: Optional[Iterable[Any]]
                       ) -> List[Any]:
        """The variables the gradients belong to; raises on bad input."""
        distribute.require_replica_context("apply()")
        if trainable_variables is None:
            if not self.built:
                raise UnbuiltApplyError(
                    "apply() got gradients without variables, but the "
                    "optimizer is not built: pass trainable_variables or "
                    "call optimizer.build(variables) first.")
            variables = list(_tf_private.keras_trainable_variables(self))
        else:
            variables = list(trainable_variables)
        if len(grads) != len(variables):
            raise ValueError(
                f"apply() got {len(grads)} gradients for {len(variables)} "
                "variables; pass one gradient (or None) per variable.")
        if all(g is None for g in grads):
            raise ValueError(
                "No gradients provided for any variable: every gradient is "
                f"None for {[getattr(v, 'path', v.name) for v in variables]}.")
        optimizer_lib.check_gradients(grads, variables)
        return variables

    def stateless_apply(self, optimizer_variables, grads,
                        trainable_variables):
        """Not supported with the TensorFlow backend (as for any optimizer)."""
        return keras.optimizers.Optimizer.stateless_apply(
            self, optimizer_variables, grads, trainable_variables)

    @tf.autograph.experimental.do_not_convert
    def minimize(self, loss: optimizer_lib.Loss, var_list: List[Any],
                 tape: Optional[tf.GradientTape] = None) -> Any:
        """TensorFlow's `minimize`: scale, differentiate, unscale, apply.

        Args:
          loss: a callable returning the loss, or a loss tensor computed
            under `tape`.
          var_list: the variables to train: a variable, a list or tuple of
            them, or a callable returning one of those (called after the
            loss, so it may name variables the loss created), as
            TensorFlow's `minimize` took them.
          tape: the `tf.GradientTape` that recorded a tensor `loss`.

        Returns:
          `iterations`.
        """
        if not callable(loss) and tape is None:
            raise ValueError(
                "minimize() needs a tape when loss is a tensor: pass "
                "tape=the tf.GradientTape that computed it, or pass a "
                f"callable loss; got loss={loss!r} and tape=None.")
        if not callable(var_list):
            var_list = _variables(var_list)
        tape = tape if tape is not None else tf.GradientTape()
        with tape:
            if callable(loss):
                loss = loss()
            scaled_loss = self.get_scaled_loss(loss)
        if callable(var_list):
            var_list = _variables(var_list())
        grads = tape.gradient(scaled_loss, var_list)
        return self.apply_gradients(
            zip(self.get_unscaled_gradients(grads), var_list))

    # The parts `optimizer_lib.LossScaleOptimizer._step` is handed.

    def _apply_inner(self, grads: List[Any], variables: List[Any]) -> None:
        self.inner_optimizer.apply(grads, variables)

    def _skip_inner(self) -> None:
        _tf_private.keras_iterations_variable(
            self.inner_optimizer).assign_add(1)

    # Serialization.

    def _serialize_inner(self) -> Dict[str, Any]:
        return keras.optimizers.serialize(self.inner_optimizer)

    @classmethod
    def _reads(cls, inner_config: Dict[str, Any]) -> bool:
        # tf_keras writes `is_legacy_optimizer` into every optimizer config
        # (and `module: keras.optimizers.legacy` for its legacy family); a
        # config without either (Keras 3, or TF <= 2.3) is Keras 3's, unless
        # tf.keras is tf_keras in this process.
        return ("is_legacy_optimizer" not in inner_config.get("config", {})
                and not str(inner_config.get("module", "")).startswith(
                    "keras.optimizers.legacy")
                and not optimizer_lib.legacy_keras_requested())

    @classmethod
    def _deserialize_inner(cls, config: Any,
                           custom_objects: Optional[Dict[str, Any]]) -> Any:
        """The inner optimizer of a config: an object stays as it is."""
        if not isinstance(config, dict):
            return config
        try:
            # Keras' deserialize edits the config it is given (it lowercases
            # class names): hand it a copy, so the caller's config stays.
            return keras.optimizers.deserialize(
                copy.deepcopy(config), custom_objects=custom_objects)
        except (TypeError, ValueError) as e:
            raise TypeError(
                "inner_optimizer must be a Keras 3 optimizer or its config; "
                f"Keras could not deserialize {config!r}: {e}") from e

    def get_config(self) -> Dict[str, Any]:
        return {"name": self.name, **super().get_config()}


# What `inspect.signature` shows: TensorFlow's documented signature.
KerasLossScaleOptimizer.__init__.__signature__ = (  # type: ignore[attr-defined]
    inspect.signature(optimizer_lib.LossScaleOptimizer.__init__))

for _name in HYPERPARAMETERS:
    setattr(KerasLossScaleOptimizer, _name, InnerAttribute(_name))
del _name


class KerasExperimentalLossScaleOptimizer(experimental.LossScaleOptimizer,
                                          KerasLossScaleOptimizer,
                                          wraps=_is_keras3_optimizer):
    """The deprecated optimizer wrapping a Keras 3 optimizer."""


experimental.register_serializable(
    keras.saving, KerasLossScaleOptimizer,
    KerasExperimentalLossScaleOptimizer,
    ("LossScaleOptimizer", "ExperimentalLossScaleOptimizer"))
