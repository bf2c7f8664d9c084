"""The Keras 3 flavour of `tf_lossscale.LossScaleOptimizer`.

`KerasLossScaleOptimizer` is also a `keras.mixed_precision.LossScaleOptimizer`,
so `model.compile` under the `mixed_float16` policy keeps it as it is, and it
uses Keras' own variable names (`dynamic_scale`, `step_counter`, under the
attribute `inner_optimizer`), so a `tf.train.Checkpoint` written with Keras'
optimizer restores into it. What it does differently from Keras' (see
`optimizer.LossScaleOptimizer`): replicas agree on the verdict before any
variable changes, `iterations` advances on skipped steps, the scale has a
floor of 1 and never grows to inf, `dynamic=False` works, and the documented
`get_scaled_loss` / `get_unscaled_gradients` flow works beside `scale_loss`.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Tuple

import keras
import tensorflow as tf

from tf_lossscale import _tf_private
from tf_lossscale import finite as finite_lib
from tf_lossscale import optimizer as optimizer_lib
from tf_lossscale.optimizer import InnerAttribute

__all__ = ["HYPERPARAMETERS", "KerasLossScaleOptimizer"]

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


def _check_inner(inner_optimizer: Any) -> None:
    """Raises unless `inner_optimizer` is a plain Keras 3 optimizer."""
    optimizer_lib.reject_loss_scale_optimizer(inner_optimizer)
    if not isinstance(inner_optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            "inner_optimizer must be a Keras 3 optimizer (an instance of "
            f"keras.optimizers.Optimizer); got {inner_optimizer!r} of type "
            f"{type(inner_optimizer).__module__}."
            f"{type(inner_optimizer).__qualname__}.")
    if inner_optimizer.loss_scale_factor is not None:
        raise ValueError(
            "inner_optimizer must not scale the loss itself, or the loss "
            "would be scaled twice; got loss_scale_factor="
            f"{inner_optimizer.loss_scale_factor!r}. Create it with "
            "loss_scale_factor=None and set the scale on the "
            "LossScaleOptimizer.")


@keras.saving.register_keras_serializable(
    package="tf_lossscale", name="LossScaleOptimizer")
class KerasLossScaleOptimizer(optimizer_lib.LossScaleOptimizer,
                              keras.mixed_precision.LossScaleOptimizer):
    """`tf_lossscale.LossScaleOptimizer` for Keras 3 optimizers.

    See `tf_lossscale.LossScaleOptimizer` for the arguments, the skip rule
    and how `apply_gradients` tells scaled from unscaled gradients.
    `minimize(loss, var_list, tape=None)` is TensorFlow's: it scales the
    loss, unscales the gradients and applies them.
    """

    def __init__(self, inner_optimizer: keras.optimizers.Optimizer,
                 dynamic: bool = True, initial_scale: Optional[float] = None,
                 dynamic_growth_steps: Optional[int] = None,
                 name: Optional[str] = None) -> None:
        _check_inner(inner_optimizer)
        settings = optimizer_lib.check_settings(
            dynamic, initial_scale, dynamic_growth_steps)
        # Keras' base constructor, not Keras' LossScaleOptimizer's, which
        # rejects dynamic=False and stores plain attributes.
        keras.optimizers.Optimizer.__init__(
            self, learning_rate=0.0, name=name)
        self._settings = settings
        self._unscaled_marks = optimizer_lib.UnscaledMarks()
        self.inner_optimizer = inner_optimizer
        if settings.dynamic:
            # Keras' names and order, for checkpoints written by its class.
            self.step_counter = self.add_variable(
                shape=(), dtype="int64", initializer="zeros",
                aggregation="none", name="step_counter")
            initial = keras.initializers.Constant(settings.initial_scale)
            self.dynamic_scale = self.add_variable(
                shape=(), dtype="float32", initializer=initial,
                aggregation="none", name="dynamic_scale")

    def build(self, var_list: List[Any]) -> None:
        """Builds the inner optimizer (if it is not yet) on `var_list`."""
        if not self.inner_optimizer.built:
            self.inner_optimizer.build(var_list)
        keras.optimizers.Optimizer.build(self, var_list)

    # Keras 3's API.

    def scale_loss(self, loss: tf.Tensor) -> tf.Tensor:
        """Keras 3's name for `get_scaled_loss`, called by `fit`."""
        return self.get_scaled_loss(loss)

    def check_finite(self, grads: Iterable[Any]) -> tf.Tensor:
        """A scalar bool tensor: True iff no gradient holds NaN or Inf."""
        return finite_lib.all_finite(list(grads))

    def apply_gradients(
            self, grads_and_vars: Iterable[Tuple[Any, Any]]) -> Any:
        """Applies one step (or skips it); returns `iterations`.

        Whether the gradients are taken as scaled or as already unscaled is
        the rule of the class docstring.
        """
        pairs = list(grads_and_vars)
        if not pairs:
            self._unscaled_marks.take()
            return self.iterations
        grads, variables = zip(*pairs)
        self.apply(list(grads), list(variables))
        return self.iterations

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
            self._unscaled_marks.take()
            return
        variables = self._variables_for(grads, trainable_variables)
        if not self.built:
            self.build(variables)
        _tf_private.keras_check_variables_are_known(self, variables)
        already_unscaled = self._unscaled_marks.take()
        self._loss_scaled_apply(grads, variables, already_unscaled)

    def _variables_for(self, grads: List[Any],
                       trainable_variables: Optional[Iterable[Any]]
                       ) -> List[Any]:
        """The variables the gradients belong to; raises on bad input."""
        optimizer_lib.require_replica_context()
        if trainable_variables is None:
            if not self.built:
                raise ValueError(
                    "apply() got gradients without variables, but the "
                    "optimizer is not built: pass trainable_variables or "
                    "call optimizer.build(variables) first.")
            variables = list(self._trainable_variables)
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

    def minimize(self, loss: optimizer_lib.Loss, var_list: List[Any],
                 tape: Optional[tf.GradientTape] = None) -> Any:
        """TensorFlow's `minimize`: scale, differentiate, unscale, apply.

        Args:
          loss: a callable returning the loss, or a loss tensor computed
            under `tape`.
          var_list: the variables to train.
          tape: the `tf.GradientTape` that recorded a tensor `loss`.

        Returns:
          `iterations`.
        """
        if not callable(loss) and tape is None:
            raise ValueError(
                "minimize() needs a tape when loss is a tensor: pass "
                "tape=the tf.GradientTape that computed it, or pass a "
                f"callable loss; got loss={loss!r} and tape=None.")
        tape = tape if tape is not None else tf.GradientTape()
        with tape:
            if callable(loss):
                loss = loss()
            scaled_loss = self.get_scaled_loss(loss)
        grads = tape.gradient(scaled_loss, var_list)
        return self.apply_gradients(
            zip(self.get_unscaled_gradients(grads), var_list))

    # Hooks of optimizer_lib.LossScaleOptimizer.

    def _apply_inner(self, grads: List[Any], variables: List[Any]) -> None:
        self.inner_optimizer.apply(grads, variables)

    def _skip_inner(self) -> None:
        _tf_private.keras_iterations_variable(
            self.inner_optimizer).assign_add(1)

    def _serialize_inner(self) -> Dict[str, Any]:
        return keras.optimizers.serialize(self.inner_optimizer)

    def get_config(self) -> Dict[str, Any]:
        return {"name": self.name, **super().get_config()}


for _name in HYPERPARAMETERS:
    setattr(KerasLossScaleOptimizer, _name, InnerAttribute(_name))
del _name
