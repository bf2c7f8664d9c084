"""`Telemetry`: what a Keras flavour keeps about its skipped steps.

The optimizer holds one as `_telemetry` and delegates to it; it owns:

- the record (`skip_record`): its variables, made beside the scale's and
  kept out of every checkpoint, the recorder the step runs in its skip
  branch, the variables' names of the last traced step (the record holds
  their indices) and `last_skip`, read from them;
- the (loss, scaled loss) each replica's scaling method saw for the step
  being built, which the record reads in its skip branch;
- the stop (`stop.Stop`, the TF1 optimizer's too): with
  `max_consecutive_skips`, a check in the traced skip branch, and
  `raise_if_stuck` on the host;
- `save_telemetry`: the variables it saves (`by_key`), as a checkpoint
  child of the inner optimizer (`track`) and in Keras 3's `.keras` files
  (`file_entry`, made by `keras_telemetry_file`).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import tensorflow as tf

from tf_lossscale import _tf_private, backprop_order, skip_record
from tf_lossscale.gradient_check import variable_name
from tf_lossscale.stop import Stop

__all__ = ["Telemetry"]


class Telemetry:
    """The record, the loss note, the stop and the saving switch."""

    def __init__(self, max_consecutive_skips: Optional[int],
                 save_telemetry: bool) -> None:
        self.stop = Stop(max_consecutive_skips)
        self.save = save_telemetry
        self.variables: skip_record.RecordVariables
        self.strategy: tf.distribute.Strategy
        self._skipped: Any = None
        self.names: List[str] = []
        # Whether the last traced step knew its backpropagation order.
        self.ordered = False
        # Per replica id: the graph (None eagerly), loss and scaled loss
        # that the scaling methods saw for the step being built.
        self.losses: Dict[int, Tuple[Any, Any, Any]] = {}
        # What `file_entry` made: Keras tells saved objects apart by id.
        self._file_entry: Any = None

    @property
    def max_consecutive_skips(self) -> Optional[int]:
        """Skipped steps in a row after which a step raises (None: never)."""
        return self.stop.limit

    def make_variables(self, skipped: tf.Variable) -> None:
        """Creates the record's variables under the current strategy;
        `skipped`: the optimizer's count of skipped steps (saved too)."""
        self.variables = skip_record.make_variables()
        self.strategy = tf.distribute.get_strategy()
        self._skipped = skipped

    def by_key(self) -> Dict[str, Any]:
        """What `save_telemetry=True` saves, by the key it is saved under:
        `skipped_steps` and the run of skipped steps (its last step, its
        length and its first step)."""
        record = self.variables
        return {"skipped_steps": self._skipped,
                "last_skip_step": record.step,
                "skip_streak": record.streak,
                "skip_streak_first_step": record.first_step}

    def track(self, parent: Any) -> None:
        """Makes the counters checkpoint dependencies of `parent` (the inner
        optimizer: the checkpoint root of every flavour's own state)."""
        holder = tf.Module(name="loss_scale_telemetry")
        for key, variable in self.by_key().items():
            setattr(holder, key, variable)
        _tf_private.track_child(parent, holder, "loss_scale_telemetry")

    def file_entry(self, make: Callable[[Dict[str, Any]], Any]
                   ) -> Optional[Any]:
        """With `save_telemetry=True`, the one object `make(by_key())` made
        for this optimizer's model files; else None (nothing saved)."""
        if not self.save:
            return None
        if self._file_entry is None:
            self._file_entry = make(self.by_key())
        return self._file_entry

    def last_skip(self) -> Optional[skip_record.SkipRecord]:
        """The last skipped step, or None (one host read)."""
        return skip_record.read(self.variables, self.names, self._worker_of,
                                self.ordered)

    def _worker_of(self, replica: int) -> Optional[int]:
        strategy = self.strategy
        if not isinstance(strategy,
                          tf.distribute.MultiWorkerMirroredStrategy):
            return None
        local = max(1, len(strategy.extended.worker_devices))
        return replica // local

    def note_loss(self, loss: Optional[Tuple[Any, Any]]) -> None:
        """Keeps the (loss, scaled loss) that this replica's scaling method
        saw for the step `apply_gradients` is building (None: not seen)."""
        graph = (None if tf.executing_eagerly()
                 else tf.compat.v1.get_default_graph())
        if loss is None:
            self.losses.pop(_replica_id(), None)
        else:
            self.losses[_replica_id()] = (graph, loss[0], loss[1])

    def _loss_here(self) -> Optional[Tuple[Any, Any]]:
        """This replica's (loss, scaled loss), if noted for this step's
        graph or an outer one (the skip branch is a graph of its own)."""
        noted = self.losses.get(_replica_id())
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

    def recorder(self, grads: List[Any], variables: List[Any],
                 iterations: Callable[[], Any]
                 ) -> Optional[Callable[..., Any]]:
        """The recorder of this step's skip branch; notes the names.

        `iterations()`: the step's number. None in a TF1 graph (tf_keras'
        `training_v1` after `disable_eager_execution`): its session
        initializes only the variables of the graph it builds, not the
        record's, which were made where the optimizer was; `last_skip`
        stays None there.
        """
        if not tf.executing_eagerly() and not tf.inside_function():
            return None
        self.names = [variable_name(v)
                      for g, v in zip(grads, variables) if g is not None]
        ranks = backprop_order.ranks(grads)
        self.ordered = ranks is not None
        check = None
        if self.stop.limit is not None and not tf.executing_eagerly():
            names = list(self.names)

            def check(record: skip_record.RecordVariables) -> Any:
                return self.stop.check(record.streak, record.used_scale(),
                                       names, record.named_indices(),
                                       record.step)
        return skip_record.recorder(
            self.variables, lambda: tf.convert_to_tensor(iterations()),
            check, ranks, self._loss_here)

    def raise_if_stuck(self, iterations: Callable[[], Any],
                       scale: Callable[[], Any],
                       floor: Optional[float]) -> None:
        """Raises `SkipStreakError` if the last `max_consecutive_skips`
        steps were all skipped (nothing when the knob is None).

        `iterations()` and `scale()`: the optimizer's step count and its
        scale now, read only when a run is long enough; `floor`: its
        `min_scale` (None with a fixed scale).
        """
        if self.stop.limit is None:
            return
        self.stop.raise_if_stuck(self.last_skip(), iterations, scale, floor)


def _replica_id() -> int:
    """The replica id of the current replica context (0 outside one, or
    where it is not a constant)."""
    context = tf.distribute.get_replica_context()
    if context is None:
        return 0
    found = tf.get_static_value(context.replica_id_in_sync_group)
    return 0 if found is None else int(found)
