"""The flavour of `tf_lossscale.LossScaleOptimizer` for tf_keras' legacy family.

`TfKerasLegacyLossScaleOptimizer` wraps an optimizer of tf_keras' legacy
family (`tf_keras.optimizers.legacy.*`, `OptimizerV2`: the optimizers of
TF 2.0-2.10's `tf.keras`, which code written for TF 2.11-2.15 reaches as
`tf.keras.optimizers.legacy`) as tf_keras' own `LossScaleOptimizer` wraps
it:

- it is an `OptimizerV2` and a `tf_keras.mixed_precision.LossScaleOptimizer`,
  so `model.compile` takes it and, under the `mixed_float16` policy, keeps it
  as it is; it is also an instance of tf_keras' own (private) class for this
  family, which TF1-style Keras models (`training_v1`, after
  `tf.compat.v1.disable_eager_execution()`) test for, to keep it and to
  scale the loss with it;
- to a checkpoint it is its inner optimizer plus a child `loss_scale`
  (`current_loss_scale`, `good_steps`) and the empty `base_optimizer` that
  restores TF 2.2 checkpoints, so `tf.train.Checkpoint`s interchange with
  tf_keras' wrapper and with the bare inner optimizer;
- `weights`, `get_weights`, `set_weights` and `variables()` are the inner
  optimizer's (an h5 file keeps no loss scale, as with tf_keras' wrapper);
- every hyperparameter of the inner optimizer (`lr`, `learning_rate`, any
  name in its `_hyper`) and its clipping attributes read and write through
  (these two: `tf_keras_legacy_delegation.OptimizerV2Delegation`, a base);
- `apply_gradients(grads_and_vars, name, experimental_aggregate_gradients)`
  sums the gradients across replicas with the inner optimizer's own
  `gradient_aggregator` before the finiteness check, and the inner
  optimizer clips the unscaled gradients when it applies them; an inner
  optimizer whose `apply_gradients` takes no
  `experimental_aggregate_gradients` (a wrapper such as Model Garden's
  `ExponentialMovingAverage`, which sums in its own inner optimizer) gets
  the replica's gradients unsummed and without that keyword, where
  tf_keras' wrapper fails with a `TypeError`;
- `minimize` works eagerly, in `tf.function` and in TF1 graphs (it returns
  the op to run), and `get_gradients` scales the loss and unscales the
  gradients.

The step is `step.loss_scaled_step`, through `LossScaleOptimizer._step`,
shared with every flavour; so are the deliberate differences of docs/differences.md
section 0 (a non-finite step changes nothing with a fixed scale too, the
knobs, `skipped_steps`). tf_keras' warning about missing scaling methods
(`ScalingWarnings`) and the other checks are `tf_keras_checks`'s, the
`loss_scale` child is `tf_keras_loss_scale_state`'s, both shared with the
current family's flavour.

`TfKerasLegacyExperimentalLossScaleOptimizer` is the deprecated
`experimental.LossScaleOptimizer(optimizer, loss_scale)` for this family.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any, Dict, List, Optional, Tuple

import tensorflow as tf
import tf_keras

from tf_lossscale import (
    _tf_private,
    distribute,
    eager_variables,
    experimental,
    tf_keras_checks,
    tf_keras_loss_scale_state,
    tf_keras_optimizer,
)
from tf_lossscale import optimizer as optimizer_lib
from tf_lossscale import settings as settings_lib
from tf_lossscale.tf_keras_legacy_delegation import (
    GradsAndVars,
    OptimizerV2Delegation,
)

__all__ = [
    "TfKerasLegacyExperimentalLossScaleOptimizer",
    "TfKerasLegacyLossScaleOptimizer",
]


def _is_legacy_optimizer(inner_optimizer: Any) -> bool:
    return isinstance(inner_optimizer, tf_keras.optimizers.legacy.Optimizer)


def _type_name(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _check_inner(inner_optimizer: Any, flavour: type) -> None:
    """Raises unless `inner_optimizer` is a plain, unwrapped legacy one."""
    optimizer_lib.reject_loss_scale_optimizer(inner_optimizer)
    if not _is_legacy_optimizer(inner_optimizer):
        raise optimizer_lib.wrong_family(
            inner_optimizer, flavour,
            "only the classic optimizers subclassing from "
            "`tf.keras.optimizers.Optimizer` can be passed (TF <= 2.10's "
            "name of tf_keras' legacy family, tf_keras.optimizers.legacy."
            "Optimizer)")
    tf_keras_checks.reject_already_wrapped(inner_optimizer)


_AGGREGATE_FLAG = "experimental_aggregate_gradients"


def _takes_aggregate_flag(optimizer: Any) -> bool:
    """Whether `optimizer.apply_gradients` takes
    `experimental_aggregate_gradients` (OptimizerV2's does).

    A wrapper subclassing OptimizerV2 may not: Model Garden's
    `ExponentialMovingAverage` declares `apply_gradients(grads_and_vars,
    name=None)` and calls its inner optimizer's, which sums the gradients
    across replicas itself.
    """
    try:
        parameters = inspect.signature(optimizer.apply_gradients).parameters
    except (TypeError, ValueError):  # No signature to read: as OptimizerV2.
        return True
    return _AGGREGATE_FLAG in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def _refuse_summed_gradients(inner: Any) -> None:
    """Raises `TypeError` for gradients already summed across several
    replicas, which an inner optimizer that sums them itself would sum
    again (with one replica summing changes nothing)."""
    replicas = distribute.num_replicas()
    if replicas == 1:
        return
    raise TypeError(
        f"apply_gradients got {_AGGREGATE_FLAG}=False under {replicas} "
        f"replicas, but the inner optimizer {_type_name(inner)} takes no "
        f"{_AGGREGATE_FLAG} (its apply_gradients sums the gradients across "
        "replicas itself), so gradients already summed would be summed "
        f"again. Pass each replica's own gradients with {_AGGREGATE_FLAG}="
        "True (the default).")


class _SlotRestorer(_tf_private.Trackable):
    """The `base_optimizer` dependency: restores TF 2.2 checkpoints' slots.

    Until TF 2.2 the wrapper tracked its inner optimizer as `base_optimizer`,
    so those checkpoints hold the slot variables under that name. tf_keras'
    wrapper adds this dependency to its inner optimizer, and so does this
    one: it holds no variable (no checkpoint key), and a restore hands the
    slots it finds to the inner optimizer.
    """

    def __init__(self, optimizer: Any) -> None:
        self._optimizer = optimizer

    def get_slot_names(self) -> List[str]:
        return self._optimizer.get_slot_names()

    def _create_or_restore_slot_variable(self, slot_variable_position: Any,
                                         slot_name: str,
                                         variable: Any) -> Any:
        return _tf_private.tf_keras_create_or_restore_slot_variable(
            self._optimizer, slot_variable_position, slot_name, variable)


_TfKerasLossScaleOptimizerV2: Any = _tf_private.tf_keras_loss_scale_optimizer_bases(
)[0]


class TfKerasLegacyLossScaleOptimizer(
        OptimizerV2Delegation,
        tf_keras_checks.ScalingWarnings,
        _TfKerasLossScaleOptimizerV2,
        _tf_private.DelegatingTrackableMixin,
        tf_keras.optimizers.legacy.Optimizer,
        tf_keras.mixed_precision.LossScaleOptimizer,
        wraps=_is_legacy_optimizer):
    """`tf_lossscale.LossScaleOptimizer` for tf_keras' legacy optimizers.

    See `tf_lossscale.LossScaleOptimizer` for the arguments, the skip rule
    and how `apply_gradients` tells scaled from unscaled gradients (unmarked
    gradients are unscaled, with tf_keras' warning). `minimize`,
    `get_gradients` and `get_updates` scale the loss and unscale the
    gradients themselves. Create it in the scope of the distribution
    strategy that trains with it, as any tf_keras optimizer.

    It derives from tf_keras' own wrapper of this family (a private class)
    only for the `isinstance` tests of tf_keras' TF1 training loops, which
    otherwise wrap it again. Everything that class defines is overridden
    here, in `OptimizerV2Delegation`, in `ScalingWarnings` or in
    `tf_lossscale.LossScaleOptimizer`, but `__getattribute__` (its fallback
    ends in `OptimizerV2Delegation.__getattr__`) and `_apply_gradients`
    (which only its own `apply_gradients` calls).
    """

    # A plain attribute per instance; this shadows tf_keras' abstract
    # `inner_optimizer` property, which has no setter.
    inner_optimizer: Any = None

    # Like tf_keras' wrapper: `apply_gradients` sums across replicas itself.
    _HAS_AGGREGATE_GRAD = True

    def _check_inner(self, inner_optimizer: Any) -> None:
        _check_inner(inner_optimizer, type(self))

    @classmethod
    def _register_joined(cls, joined: type, derived: type) -> None:
        experimental.register_joined(tf_keras.saving, joined, derived, cls)

    @_tf_private.no_automatic_dependency_tracking
    def _build(self, inner_optimizer: Any, settings: settings_lib.Settings,
               name: Optional[str]) -> None:
        # Not OptimizerV2's constructor: every variable (iterations, slots,
        # hyperparameters) is the inner optimizer's, and so is every
        # checkpoint key.
        _tf_private.DelegatingTrackableMixin.__init__(self, inner_optimizer)
        self.inner_optimizer = inner_optimizer
        self._name = name or "LossScaleOptimizer"
        self._init_loss_scaling(settings)
        variables = tf_keras_loss_scale_state.track_loss_scale_state(
            inner_optimizer, settings)
        self._set_scale_variables(variables)
        for variable in variables:
            # In a TF1 graph, tf_keras' session initializes the variables it
            # was told of (its own wrapper tells it of its scale's).
            if variable is not None:
                tf_keras.__internal__.backend.track_variable(variable)
        _tf_private.track_child(inner_optimizer,
                                _SlotRestorer(inner_optimizer),
                                "base_optimizer")
        _tf_private.mark_wrapped_by_loss_scale_optimizer(inner_optimizer)

    # The step.

    def _compute_gradients(self, loss: optimizer_lib.Loss, var_list: Any,
                           grad_loss: Any = None,
                           tape: Optional[tf.GradientTape] = None
                           ) -> List[Tuple[Any, Any]]:
        """Unscaled gradients of `loss`, computed from the scaled loss.

        OptimizerV2's `minimize` (and so `fit`) calls this and then
        `apply_gradients`, which takes these gradients as unscaled.
        """
        tape = tape if tape is not None else tf.GradientTape()
        with tape:
            scaled_loss = self.get_scaled_loss(loss)
        pairs = _tf_private.tf_keras_compute_gradients(
            self.inner_optimizer, scaled_loss, var_list, grad_loss, tape=tape)
        grads = self.get_unscaled_gradients([g for g, _ in pairs])
        return list(zip(grads, [v for _, v in pairs]))

    @tf.autograph.experimental.do_not_convert
    def get_gradients(self, loss: tf.Tensor, params: Any) -> List[Any]:
        """Unscaled gradients of `loss` for `params` (TF1 graphs)."""
        scaled_loss = self.get_scaled_loss(loss)
        grads = self.inner_optimizer.get_gradients(scaled_loss, params)
        return self.get_unscaled_gradients(grads)

    @tf.autograph.experimental.do_not_convert
    def apply_gradients(self, grads_and_vars: GradsAndVars,
                        name: Optional[str] = None,
                        experimental_aggregate_gradients: bool = True
                        ) -> Optional[tf.Operation]:
        """Applies one step (or skips it).

        The gradients are summed across replicas first, by the inner
        optimizer's `gradient_aggregator` (unless
        `experimental_aggregate_gradients=False`, or the inner optimizer's
        `apply_gradients` takes no such argument and sums them itself), and
        the replicas agree on one verdict, so a NaN on any replica makes
        every replica skip. Whether they are taken as scaled or already
        unscaled is the rule of `tf_lossscale.LossScaleOptimizer`. None
        gradients are left out.

        Returns:
          As tf_keras' wrapper: in a graph (TF1 or `tf.function`) the op that
          runs the step, eagerly None.

        Raises:
          ValueError: called in a cross-replica context or under an
            unsupported strategy, every gradient is None, or a gradient's
            shape does not fit its variable.
          TypeError: a gradient is not floating point, or
            `experimental_aggregate_gradients=False` under several replicas
            for an inner optimizer that sums the gradients itself. Nothing
            changes then.
        """
        distribute.check_supported_strategy("LossScaleOptimizer")
        inner = self.inner_optimizer
        sums_itself = not _takes_aggregate_flag(inner)
        if sums_itself and not experimental_aggregate_gradients:
            _refuse_summed_gradients(inner)
        self._warn_about_scaling()
        pairs = tf_keras_checks.checked_pairs(grads_and_vars)
        if not pairs:
            self._marks.take([])
            return tf.no_op()
        # The verdict was of the gradients before they are summed across
        # replicas: the step checks the sums again (unless summing passed
        # them on as they were: one replica).
        before = [g for g, _ in pairs]
        taken = self._decide(before)
        # As with tf_keras' wrapper, the inner optimizer creates its slots
        # when it first applies a step: eagerly, a skipped first step
        # creates none. One that sums the gradients itself gets them
        # unsummed; the replicas still agree on one verdict (the step).
        if experimental_aggregate_gradients and not sums_itself:
            pairs = _tf_private.tf_keras_aggregate_gradients(inner, pairs)
        grads, variables = [g for g, _ in pairs], [v for _, v in pairs]
        taken = taken.summed(before, grads)
        with tf.name_scope(name or self._name):
            step = tf.group(self._step(grads, variables, taken))
        return distribute.one_op_for_every_replica(step)

    # The parts `optimizer_lib.LossScaleOptimizer._step` is handed.

    def _apply_inner(self, grads: List[Any], variables: List[Any]) -> Any:
        # Already summed across replicas (or the caller chose not to), or
        # for an inner optimizer that sums them itself; the inner optimizer
        # clips them as it applies them.
        # It creates its slots in its first step (eagerly): not lifted.
        pairs = list(zip(grads, variables))
        with eager_variables.made_eagerly():
            if not _takes_aggregate_flag(self.inner_optimizer):
                return self.inner_optimizer.apply_gradients(pairs)
            return self.inner_optimizer.apply_gradients(
                pairs, experimental_aggregate_gradients=False)

    def _skip_inner(self) -> Any:
        return self.inner_optimizer.iterations.assign_add(1, read_value=False)

    # Serialization.

    def _serialize_inner(self) -> Dict[str, Any]:
        return tf_keras.optimizers.serialize(self.inner_optimizer)

    @classmethod
    def _reads(cls, inner_config: Dict[str, Any]) -> bool:
        # tf_keras' own rule: its current family writes
        # `is_legacy_optimizer: False`; a config without it is a legacy one
        # (written by this family, `module: keras.optimizers.legacy`, or by
        # TF <= 2.10), when tf.keras is tf_keras or the module says so.
        args = inner_config.get("config")
        flag = args.get("is_legacy_optimizer") if isinstance(
            args, dict) else None
        if flag is not None:
            return bool(flag)
        module = inner_config.get("module") or ""
        return (optimizer_lib.legacy_keras_requested()
                or module.startswith("keras.optimizers.legacy"))

    @classmethod
    def _deserialize_inner(cls, config: Any,
                           custom_objects: Optional[Dict[str, Any]]) -> Any:
        if not isinstance(config, dict):
            return config
        # As tf_keras' wrapper: a legacy optimizer, `decay` and all. Its
        # deserialize edits the config it is given: hand it a copy.
        return tf_keras.optimizers.deserialize(
            copy.deepcopy(config), custom_objects=custom_objects,
            use_legacy_optimizer=True)


class TfKerasLegacyExperimentalLossScaleOptimizer(
        experimental.LossScaleOptimizer, TfKerasLegacyLossScaleOptimizer,
        wraps=_is_legacy_optimizer):
    """The deprecated optimizer wrapping a tf_keras legacy optimizer."""


experimental.register_serializable(
    tf_keras.saving, TfKerasLegacyLossScaleOptimizer,
    TfKerasLegacyExperimentalLossScaleOptimizer,
    ("LegacyLossScaleOptimizer", "LegacyExperimentalLossScaleOptimizer"))


def _register_for_conversion() -> None:
    """Lets `tf_keras.optimizers.convert_to_legacy_optimizer` convert ours.

    tf_keras' converter turns a wrapper of the current family into one of
    the legacy family by looking the wrapper's class name, lowercased, up in
    tf_keras' custom objects (and converting its inner optimizer, which it
    does for instances of tf_keras' own wrapper, of which the current
    flavour is one). The names of the current flavours lead to this
    module's.
    """
    custom_objects = tf_keras.utils.get_custom_objects()
    for current, legacy in (
            (tf_keras_optimizer.TfKerasLossScaleOptimizer,
             TfKerasLegacyLossScaleOptimizer),
            (tf_keras_optimizer.TfKerasExperimentalLossScaleOptimizer,
             TfKerasLegacyExperimentalLossScaleOptimizer)):
        custom_objects.setdefault(current.__name__.lower(), legacy)


_register_for_conversion()
