"""`SkipReporting`: the optimizer's side of `skip_record` and of the stop.

A base of `optimizer.LossScaleOptimizer`. It makes the record's variables
beside the scale's (kept out of every checkpoint), hands the step a
recorder for its skip branch, remembers the variables' names of the last
traced step (the record holds their indices), and, with
`max_consecutive_skips=K`, stops a run that skipped K steps in a row:

- eagerly, the step raises `SkipStreakError` once it has run;
- inside a `tf.function`, a check in the skip branch fails the step (it
  surfaces as `tf.errors.InvalidArgumentError`, the base class of
  `SkipStreakError`, with the same message): TensorFlow rebuilds no
  exception type of ours from a graph;
- under XLA (`jit_compile=True`), which drops graph assertions, call
  `raise_if_stuck()` after the step: one host read of a few scalars.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import tensorflow as tf

from tf_lossscale import _tf_private, backprop_order, skip_record
from tf_lossscale.gradient_check import variable_name

__all__ = ["SkipReporting"]


class _Reporting:
    """What the record needs on the host (not tracked by Keras)."""

    def __init__(self, variables: skip_record.RecordVariables,
                 strategy: tf.distribute.Strategy) -> None:
        self.variables = variables
        self.strategy = strategy
        self.names: List[str] = []
        # Whether the last traced step knew its backpropagation order.
        self.ordered = False
        # Per replica id: the graph (None eagerly), loss and scaled loss
        # that the scaling methods saw for the step being built.
        self.losses: Dict[int, Tuple[Any, Any, Any]] = {}
        # A flavour's view of the telemetry for its whole-model files.
        self.file_entry: Any = None


class SkipReporting:
    """`last_skip`, `raise_if_stuck` and the recorder the step runs."""

    _settings: Any
    _reporting: _Reporting
    _scale_variables: Any
    iterations: Any

    def _make_skip_record(self) -> None:
        """Creates the record's variables under the current strategy."""
        self._reporting = _Reporting(skip_record.make_variables(),
                                     tf.distribute.get_strategy())

    def _telemetry_variables(self) -> Dict[str, Any]:
        """What `save_telemetry=True` saves, by the key it is saved under:
        `skipped_steps` and the run of skipped steps (its last step, its
        length and its first step)."""
        record = self._reporting.variables
        return {"skipped_steps": self._scale_variables.skipped,
                "last_skip_step": record.step,
                "skip_streak": record.streak,
                "skip_streak_first_step": record.first_step}

    def _track_telemetry(self, parent: Any) -> None:
        """Makes the counters checkpoint dependencies of `parent` (the inner
        optimizer: the checkpoint root of every flavour's own state)."""
        holder = tf.Module(name="loss_scale_telemetry")
        for key, variable in self._telemetry_variables().items():
            setattr(holder, key, variable)
        _tf_private.track_child(parent, holder, "loss_scale_telemetry")

    @property
    def save_telemetry(self) -> bool:
        """Whether checkpoints hold `skipped_steps` and the skip run."""
        return self._settings.save_telemetry

    @property
    def max_consecutive_skips(self) -> Optional[int]:
        """Skipped steps in a row after which a step raises (None: never)."""
        return self._settings.max_consecutive_skips

    @property
    def last_skip(self) -> Optional[skip_record.SkipRecord]:
        """The last skipped step: which gradients, when, where; or None.

        A frozen `SkipRecord`; `str()` of it reads `step 12 skipped on
        replica 0: Inf entered at dense in the backward pass (the loss was
        finite); 2 of 40 gradients non-finite in dense; scale 2^15`. Works after an eager step and after a
        `tf.function` step alike (one host read of a few scalars). Not
        saved in checkpoints.
        """
        reporting = self._reporting
        return skip_record.read(reporting.variables, reporting.names,
                                self._worker_of, reporting.ordered)

    def _worker_of(self, replica: int) -> Optional[int]:
        strategy = self._reporting.strategy
        if not isinstance(strategy,
                          tf.distribute.MultiWorkerMirroredStrategy):
            return None
        local = max(1, len(strategy.extended.worker_devices))
        return replica // local

    def _note_loss(self, loss: Optional[Tuple[Any, Any]]) -> None:
        """Keeps the (loss, scaled loss) that this replica's scaling method
        saw for the step `apply_gradients` is building (None: not seen)."""
        if not hasattr(self, "_reporting"):
            return
        graph = (None if tf.executing_eagerly()
                 else tf.compat.v1.get_default_graph())
        losses = self._reporting.losses
        if loss is None:
            losses.pop(_replica_id(), None)
        else:
            losses[_replica_id()] = (graph, loss[0], loss[1])

    def _loss_here(self) -> Optional[Tuple[Any, Any]]:
        """This replica's (loss, scaled loss), if noted for this step's
        graph or an outer one (the skip branch is a graph of its own)."""
        noted = self._reporting.losses.get(_replica_id())
        if noted is None:
            return None
        graph, loss, scaled = noted
        if graph is None:
            return (loss, scaled) if tf.executing_eagerly() else None
        here: Any = tf.compat.v1.get_default_graph()
        while here is not None:
            if here is graph:
                return loss, scaled
            here = getattr(here, "outer_graph", None)
        return None

    def _skip_recorder(self, grads: List[Any], variables: List[Any]
                       ) -> Optional[Callable[..., Any]]:
        """The recorder of this step's skip branch; notes the names.

        None in a TF1 graph (tf_keras' `training_v1` after
        `disable_eager_execution`): its session initializes only the
        variables of the graph it builds, not the record's, which were
        made where the optimizer was; `last_skip` stays None there.
        """
        if not tf.executing_eagerly() and not tf.inside_function():
            return None
        self._reporting.names = [variable_name(v)
                                 for g, v in zip(grads, variables)
                                 if g is not None]
        ranks = backprop_order.ranks(grads)
        self._reporting.ordered = ranks is not None
        check = None
        if self.max_consecutive_skips is not None and (
                not tf.executing_eagerly()):
            names = list(self._reporting.names)
            check = lambda record: self._graph_check(record, names)  # noqa: E731
        return skip_record.recorder(
            self._reporting.variables,
            lambda: tf.convert_to_tensor(self.iterations), check, ranks,
            self._loss_here)

    def _graph_check(self, record: skip_record.RecordVariables,
                     names: List[str]) -> Any:
        """Fails the traced step once the streak reaches the limit."""
        limit = self.max_consecutive_skips
        streak = tf.convert_to_tensor(record.streak)
        indices = tf.convert_to_tensor(record.indices)
        table = tf.constant(names + ["?"])
        picked = tf.gather(table, tf.where(indices < 0, len(names), indices))
        picked = tf.boolean_mask(picked, indices >= 0)
        message = tf.strings.join([
            f"{skip_record.SkipStreakError.__name__}: ",
            tf.strings.as_string(streak),
            f" steps in a row were skipped (max_consecutive_skips={limit}); "
            "the last, step ", tf.strings.as_string(
                tf.convert_to_tensor(record.step)),
            ", used scale ", tf.strings.as_string(
                tf.convert_to_tensor(record.scale), shortest=True),
            " and had non-finite gradients: ",
            tf.strings.reduce_join(picked, separator=", ")])
        return tf.debugging.Assert(streak < limit, [message])

    def raise_if_stuck(self) -> None:
        """Raises `SkipStreakError` if the last `max_consecutive_skips`
        steps were all skipped (does nothing when the knob is None).

        The step calls it itself when it runs eagerly; call it after a
        `jit_compile=True` step, where a graph check cannot raise.
        """
        limit = self.max_consecutive_skips
        if limit is None:
            return
        record = self.last_skip
        iterations = int(tf.convert_to_tensor(self.iterations))
        # A later step (applied) ended the run; inside a failed traced step
        # `iterations` may or may not have advanced past the record.
        if (record is None or record.streak < limit
                or record.step + 1 < iterations):
            return
        scale = float(tf.convert_to_tensor(getattr(self, "loss_scale")))  # noqa: B009
        floor = float(getattr(self, "min_scale", 0.0))
        at_floor = (f" It is at min_scale: {record.verdict_at_floor()}."
                    if getattr(self, "dynamic", False)
                    and scale <= floor else "")
        raise skip_record.SkipStreakError(
            f"{record.streak} steps in a row were skipped "
            f"(max_consecutive_skips={limit}), steps {record.first_step} to "
            f"{record.step}; the last: {record}; the scale is now "
            f"{skip_record.scale_text(scale)}.{at_floor}", record)


def _replica_id() -> int:
    """The replica id of the current replica context (0 outside one, or
    where it is not a constant)."""
    context = tf.distribute.get_replica_context()
    if context is None:
        return 0
    found = tf.get_static_value(context.replica_id_in_sync_group)
    return 0 if found is None else int(found)
