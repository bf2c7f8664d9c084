"""`MixedPrecisionLossScaleOptimizer`: loss scaling for TF1 graph-mode code.

Wraps a `tf.compat.v1.train.Optimizer` the way TensorFlow's own
`tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer` does, on the
loss scales of this package::

    grads_and_vars = opt.compute_gradients(loss)   # loss * scale, grads / scale
    train_op = opt.apply_gradients(grads_and_vars, global_step)
    # One op: loss_scale.update(grads), and the inner optimizer's update
    # (with the global_step increment) only if every gradient is finite.

A skipped step changes no variable, no slot and not `global_step`, as in
TensorFlow's class: `global_step` counts applied steps. `apply_gradients`
runs in a replica context and merges into the cross-replica context for the
loss-scale update, so under a `tf.distribute` strategy a NaN on any one
replica makes every replica skip. Graph-mode code lives only in this module
(and in the stop's counter of a TF1 graph, `stop.Stop.counter`).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import tensorflow as tf

from tf_lossscale import (
    _checks,
    _tf_private,
    distribute,
    gradient_check,
    skip_record,
)
from tf_lossscale import finite as finite_lib
from tf_lossscale import loss_scale as loss_scale_lib
from tf_lossscale.stop import Stop
from tf_lossscale.v1_skip_record import V1SkipRecord

__all__ = ["MixedPrecisionLossScaleOptimizer"]

GradsAndVars = Sequence[Tuple[Any, tf.Variable]]
LossLike = Union[tf.Tensor, Callable[[], tf.Tensor]]

# TensorFlow ships no types: to mypy this is `Any`, a valid base class.
_V1Optimizer: Any = tf.compat.v1.train.Optimizer
# TensorFlow's own loss scales, which its optimizer takes as `loss_scale`
# (ours use them as they are: same methods, same checkpoint keys).
_TF_LOSS_SCALE: Any = tf.compat.v1.mixed_precision.LossScale
_ACCEPTED_LOSS_SCALES = (
    "'dynamic', an int or float >= 1, a tf_lossscale.LossScale or a "
    "tf.compat.v1.mixed_precision.LossScale")


class NotAV1OptimizerError(TypeError, ValueError):
    """`opt` is not a `tf.compat.v1.train.Optimizer`.

    Both a `TypeError` (the kind of mistake it is) and a `ValueError` (what
    TensorFlow's own class raises), so code written against either catches it.
    """

    # Rebuildable by AutoGraph, so `tf.function` callers see this type
    # (see `distribute.ReplicaContextError`).
    __init__ = Exception.__init__


def _check_optimizer(opt: Any) -> None:
    """Raises unless `opt` is a TF1 optimizer.

    A `MixedPrecisionLossScaleOptimizer` (ours or TensorFlow's) is one, and
    TensorFlow's class wraps it again (the loss is scaled by both scales and
    each unscales its own), so ours does too.
    """
    if not isinstance(opt, _V1Optimizer):
        raise NotAV1OptimizerError(
            "opt must be a tf.compat.v1.train.Optimizer (for example "
            "tf.compat.v1.train.MomentumOptimizer); got "
            f"{opt!r} of type {type(opt).__module__}.{type(opt).__name__}. "
            "For a Keras optimizer use tf_lossscale.LossScaleOptimizer.")


def _resolve_loss_scale(loss_scale: Any) -> Any:
    """Turns the `loss_scale` argument into a `LossScale`, or raises ValueError.

    A `LossScale` of TensorFlow's is used as it is, as TensorFlow's class
    uses it. None is refused: this optimizer exists to scale the loss.
    """
    if isinstance(loss_scale, _TF_LOSS_SCALE):
        return loss_scale
    if loss_scale is None:
        # TensorFlow's phrase first, so code matching its message still does.
        raise ValueError(
            f"loss_scale cannot be None: it must be {_ACCEPTED_LOSS_SCALES}; "
            "got None, which MixedPrecisionLossScaleOptimizer does not accept "
            "(it always scales the loss). Use the inner optimizer alone to "
            "train without loss scaling.")
    is_dynamic = isinstance(loss_scale, str) and loss_scale == "dynamic"
    if not (is_dynamic or _checks.is_real(loss_scale)
            or isinstance(loss_scale, loss_scale_lib.LossScale)):
        raise ValueError(
            f"Could not interpret loss scale identifier: {loss_scale}. "
            f"loss_scale must be {_ACCEPTED_LOSS_SCALES}; got {loss_scale!r} "
            f"of type {type(loss_scale).__name__}.")
    try:
        resolved = loss_scale_lib.get(loss_scale)
    except ValueError as e:
        raise ValueError(
            f"loss_scale must be {_ACCEPTED_LOSS_SCALES}; got "
            f"{loss_scale!r}: {e}") from None
    if resolved is None:  # None was refused above; `get` maps only it so.
        raise ValueError(f"loss_scale must be {_ACCEPTED_LOSS_SCALES}.")
    return resolved


class MixedPrecisionLossScaleOptimizer(_V1Optimizer):
    """A `tf.compat.v1.train.Optimizer` that applies loss scaling.

    `compute_gradients` multiplies the loss by the loss scale and divides the
    gradients by it; `apply_gradients` returns one op that updates the loss
    scale and applies the gradients only when all of them are finite.
    """

    def __init__(self, opt: Any, loss_scale: Any, *,
                 max_consecutive_skips: Optional[int] = None) -> None:
        """Wraps `opt`.

        Args:
          opt: the `tf.compat.v1.train.Optimizer` that applies the gradients.
          loss_scale: "dynamic" (a default `DynamicLossScale`), an int or
            float >= 1 (a `FixedLossScale`), or a `LossScale` (ours or
            TensorFlow's `tf.compat.v1.mixed_precision.LossScale`).
          max_consecutive_skips: None (default: never stop, as TensorFlow's
            class), or an int >= 1: the train op that skips that many steps
            in a row fails, naming the variables with non-finite gradients
            and the scale (`tf.errors.InvalidArgumentError` from
            `Session.run` and `tf.function`; eagerly, once the step has
            run, `tf_lossscale.SkipStreakError`, its subclass, carrying
            `last_skip`): the Keras flavours' stop (`stop`). In a TF1 graph
            its counter is a variable of the graph (initialize it with the
            others; a `tf.compat.v1.train.Saver` saves it, a
            `tf.train.Checkpoint` does not).

        Raises:
          TypeError: `opt` is not a TF1 optimizer (the error is also a
            ValueError, as TensorFlow raises).
          ValueError: `loss_scale` is None or not one of the accepted forms.
        """
        _check_optimizer(opt)
        resolved = _resolve_loss_scale(loss_scale)
        if max_consecutive_skips is not None:
            max_consecutive_skips = _checks.check_int(
                "max_consecutive_skips", max_consecutive_skips, minimum=1)
        self._stop = Stop(max_consecutive_skips)
        self._record: Optional[V1SkipRecord] = None
        if V1SkipRecord.available():
            # Made now, not by a first step: a `tf.function` that creates
            # variables traces twice (TensorFlow's optimizer: once).
            self._record = V1SkipRecord()
        # The wrapper applies nothing itself, so locking is the inner's.
        super().__init__(use_locking=False, name=opt.get_name())
        self._optimizer = opt
        self._loss_scale = resolved
        # TensorFlow's checkpoint keys, so checkpoints interchange.
        self._track_trackable(opt, "base_optimizer")
        self._track_trackable(resolved, "loss_scale")

    @property
    def inner_optimizer(self) -> Any:
        """The wrapped optimizer."""
        return self._optimizer

    @property
    def loss_scale(self) -> Any:
        """The `LossScale` this optimizer uses (ours, or TensorFlow's)."""
        return self._loss_scale

    @property
    def last_skip(self) -> Optional[skip_record.SkipRecord]:
        """The last skipped step (`tf_lossscale.SkipRecord`), or None.

        Which gradients were NaN or Inf, the scale the step used, the run
        of skipped steps it ends; `str()` of it is one line. Its `step`
        counts this optimizer's `apply_gradients` steps, skipped ones
        included (`global_step` counts applied ones). Kept where the
        optimizer runs eagerly or in a `tf.function`; in a TF1 graph
        (`Session.run`) it is always None (see `v1_skip_record`). Not
        saved in checkpoints. TensorFlow's class has no such attribute.
        """
        if self._record is None or not tf.executing_eagerly():
            return None
        return self._record.read()

    def compute_gradients(
        self,
        loss: LossLike,
        var_list: Optional[Sequence[tf.Variable]] = None,
        gate_gradients: int = _V1Optimizer.GATE_OP,
        aggregation_method: Any = None,
        colocate_gradients_with_ops: bool = False,
        grad_loss: Optional[tf.Tensor] = None,
    ) -> List[Tuple[Any, tf.Variable]]:
        """Gradients of `loss * scale`, divided by the scale.

        Arguments as for `tf.compat.v1.train.Optimizer.compute_gradients`;
        `loss` is a tensor or a callable returning one. The scale is read once
        and cast to the loss dtype; the gradients keep None entries, sparse
        `tf.IndexedSlices` and their dtypes.

        Returns:
          A list of (unscaled gradient or None, variable) pairs.
        """
        scale = self._loss_scale()
        grads_and_vars = self._optimizer.compute_gradients(
            _scaled_loss(loss, scale),
            var_list=var_list,
            gate_gradients=gate_gradients,
            aggregation_method=aggregation_method,
            colocate_gradients_with_ops=colocate_gradients_with_ops,
            grad_loss=grad_loss)
        grads = finite_lib.unscale_all([g for g, _ in grads_and_vars], scale)
        return [(g, v) for g, (_, v) in zip(grads, grads_and_vars)]

    # Not converted by AutoGraph: no data-dependent Python control flow
    # (the branches are `tf.cond`s); converting it and what it calls cost
    # seconds on the first trace of a `tf.function` step.
    @tf.autograph.experimental.do_not_convert
    def apply_gradients(
        self,
        grads_and_vars: GradsAndVars,
        global_step: Optional[tf.Variable] = None,
        name: Optional[str] = None,
    ) -> tf.Operation:
        """One op: update the loss scale, apply the gradients if all finite.

        Must be called in a replica context (anywhere outside a strategy, or
        inside `strategy.run`/`call_for_each_replica`); it merges into the
        cross-replica context so every replica takes the same verdict.

        Args:
          grads_and_vars: (gradient, variable) pairs from `compute_gradients`.
          global_step: optional variable incremented by one on each applied
            step. Skipped steps leave it unchanged, as TensorFlow's own class
            does.
          name: name of the returned op; defaults to the optimizer's name.

        Returns:
          The training op.

        Raises:
          ReplicaContextError: called in a cross-replica context (both a
            RuntimeError and, as TensorFlow raises, a ValueError).
          ValueError: no variables, or no variable has a gradient.
        """
        distribute.require_replica_context(
            "MixedPrecisionLossScaleOptimizer.apply_gradients()")
        grads_and_vars = tuple(grads_and_vars)
        _check_has_gradients(grads_and_vars)
        return tf.distribute.get_replica_context().merge_call(
            self._apply_in_cross_replica_context,
            args=(grads_and_vars, global_step, name))

    def minimize(
        self,
        loss: LossLike,
        global_step: Optional[tf.Variable] = None,
        var_list: Optional[Sequence[tf.Variable]] = None,
        gate_gradients: int = _V1Optimizer.GATE_OP,
        aggregation_method: Any = None,
        colocate_gradients_with_ops: bool = False,
        name: Optional[str] = None,
        grad_loss: Optional[tf.Tensor] = None,
    ) -> tf.Operation:
        """`compute_gradients` then `apply_gradients`, both loss-scaled."""
        grads_and_vars = self.compute_gradients(
            loss, var_list=var_list, gate_gradients=gate_gradients,
            aggregation_method=aggregation_method,
            colocate_gradients_with_ops=colocate_gradients_with_ops,
            grad_loss=grad_loss)
        return self.apply_gradients(
            grads_and_vars, global_step=global_step, name=name)

    # get_slot / get_slot_names are the base class's, as in TensorFlow's
    # wrapper: the slots are the inner optimizer's (`inner_optimizer.
    # get_slot`). Reporting them here too made a checkpoint hold each twice.

    def variables(self) -> List[tf.Variable]:
        """The inner optimizer's variables, then the loss scale's.

        Both lists hold the variables of the current default graph.
        """
        view = tf.train.TrackableView(self._loss_scale)
        own = [v for v in view.children(self._loss_scale).values()
               if isinstance(v, tf.Variable)]
        return list(self._optimizer.variables()) + own

    def _apply_in_cross_replica_context(
        self,
        strategy: tf.distribute.Strategy,
        grads_and_vars: GradsAndVars,
        global_step: Optional[tf.Variable],
        name: Optional[str],
    ) -> tf.Operation:
        """Updates the loss scale and applies the gradients if it says so.

        `grads_and_vars` holds per-replica gradients here; the loss scale
        reduces its finiteness verdict over all replicas.
        """
        name = name or self.get_name()
        grads = [g for g, _ in grads_and_vars]
        mode = finite_lib.compile_mode()
        record = self._skip_record()
        stops = self._stop.limit is not None
        # The scale the step uses, read before the update (in a TF1 graph,
        # which orders no stateful ops, by a control dependency).
        scale = (self._loss_scale() if record is not None or stops
                 else None)
        with (tf.control_dependencies([scale]) if record is None and stops
              else contextlib.nullcontext()):
            update_op, should_apply = self._loss_scale.update(grads)
        if should_apply is True:
            # A fixed scale says "apply" whatever the gradients; a step with
            # a NaN or Inf is skipped all the same (docs/differences.md).
            should_apply = distribute.cross_replica_all_finite(grads)

        def apply_fn() -> tf.Operation:
            per_replica = strategy.extended.call_for_each_replica(
                self._optimizer.apply_gradients,
                args=(grads_and_vars, global_step, name + "-wrapped"))
            return strategy.group(per_replica)

        skip_fn: Callable[[], Any] = tf.no_op
        if record is not None:
            check = None
            if stops and not tf.executing_eagerly() and (
                    mode is not finite_lib.Mode.WHOLE):
                check = self._check_streak
            skip_fn = record.recording(skip_fn, grads_and_vars, strategy,
                                       scale, check)
        elif stops:
            present = [(g, v) for g, v in grads_and_vars if g is not None]
            apply_fn, skip_fn = self._stop.counting(
                apply_fn, skip_fn, scale,
                [gradient_check.variable_name(v) for _, v in present],
                lambda: _nonfinite([g for g, _ in present], strategy))
        if any(_tf_private.is_reference_variable(v)
               for _, v in grads_and_vars):
            # A reference variable (use_resource=False) cannot be captured
            # by a TF2 `cond` (float32_ref); TF1's Switch/Merge takes it.
            with _tf_private.tf1_control_flow():
                maybe_apply = distribute.branch(should_apply, apply_fn,
                                                skip_fn)
        else:
            maybe_apply = distribute.branch(
                should_apply, apply_fn, skip_fn,
                mode is finite_lib.Mode.WHOLE)
        counted = None if record is None else record.count_step()
        ops = [op for op in (maybe_apply, update_op, counted)
               if op is not None]
        train_op = tf.group(*ops, name=name)
        if stops and record is not None and tf.executing_eagerly():
            # The step has run: the stop's eager half (as the Keras
            # flavours' step calls `raise_if_stuck`).
            self._stop.raise_if_stuck(record.read(), lambda: record.steps,
                                      self._loss_scale, None)
        return train_op

    def _check_streak(self, variables: skip_record.RecordVariables,
                      names: List[str]) -> Any:
        """The stop's check on the record a traced step wrote."""
        return self._stop.check(variables.streak, variables.used_scale(),
                                names, variables.named_indices(),
                                variables.step)

    def _skip_record(self) -> Optional[V1SkipRecord]:
        """The record a step built here writes; None in a TF1 graph."""
        if not V1SkipRecord.available():
            return None
        if self._record is None:
            self._record = V1SkipRecord()
        return self._record


def _nonfinite(grads: List[Any], strategy: tf.distribute.Strategy) -> Any:
    """Per gradient, whether any replica's holds a NaN or an Inf (the
    names of a TF1 graph's stop, which keeps no record)."""
    return tf.stack([tf.reduce_any([
        tf.logical_not(tf.reduce_all(tf.math.is_finite(
            x.values if isinstance(x, tf.IndexedSlices) else x)))
        for x in strategy.experimental_local_results(g)])
        for g in grads])


def _scaled_loss(loss: LossLike, scale: tf.Tensor) -> LossLike:
    """`loss * scale` in the loss dtype; a callable stays a callable."""
    if callable(loss):
        return lambda: _scaled_loss(loss(), scale)
    gradient_check.check_loss(loss)
    loss = tf.convert_to_tensor(loss)
    return loss * tf.cast(scale, loss.dtype)


def _check_has_gradients(grads_and_vars: GradsAndVars) -> None:
    """Raises ValueError before any op is built for an empty step."""
    if not grads_and_vars:
        raise ValueError(
            "apply_gradients() got no (gradient, variable) pairs; pass the "
            "list that compute_gradients() returned.")
    if all(g is None for g, _ in grads_and_vars):
        raise ValueError(
            "No gradients provided for any variable: every gradient in "
            f"{[v.name for _, v in grads_and_vars]} is None; check that the "
            "loss depends on the variables.")
