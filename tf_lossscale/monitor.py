"""`LossScaleMonitor`: the loss scale and the skipped steps in fit's logs.

A Keras callback for Keras 3 and tf_keras models alike. After each batch and
each epoch it adds `loss_scale` and `skipped_steps` (read from the model's
`tf_lossscale.LossScaleOptimizer`) to the `logs` dict that `fit` hands to
every callback in turn, so they show in the progress bar, `History`,
`CSVLogger` and Keras' `TensorBoard` callback.

Which callbacks see them (both Kerases hand one dict to the callbacks in
list order): those after the monitor. `fit` appends its own `History` and
progress bar after every callback you pass, so those always do; list the
monitor before `CSVLogger`, `TensorBoard`, a `ProgbarLogger` of your own or
any callback of yours that reads its keys. tf_keras' progress bar averages every value over the epoch
unless it is one of its "stateful metrics": the monitor adds its two names
there, so the bar shows the current scale and count, not a mean.

It reads three scalars per batch (the scale, the skip count and
`iterations`), in Python, after the step has run: the traced train step
gains no op and no host sync.

It says why a step was skipped, quietly enough for a million-step run
(`report=True`, the default): one line when a run of skipped steps
begins, from the optimizer's `last_skip` (read only then), e.g.
`step 0 skipped on replica 0: Inf entered at l11 in the backward pass (the
loss was finite); 24 of 26 gradients non-finite, l11 .. l0; scale 2^30 ->
2^29` (where the overflow entered, nearest the loss, and which pass), and
one more if the run goes on to reach `min_scale`, saying what that means
for the pass it came from (a NaN loss: the forward pass or the batch; a
finite loss: a real NaN in the backward pass, not overflow). Where the
source layer's gradients hold NaN only after a finite loss
(`SkipRecord.undecided`: a convolution's or an LSTM's overflow leaves
that, and so does a real NaN), the first line says `float16 overflow can
leave NaN here`, and when the back-off ends that run the monitor says it
was overflow (`steps 0-13 skipped, and the next applied at 2^16: the NaN at
c3 was float16 overflow, which the back-off cured`), once per layer and
`fit`. `skip_streak` (skipped steps in a row) and
`nonfinite_gradients` (non-finite gradients of the batch's last skipped
step, 0 if none was) go into `logs` too.

With `deep_look=True` (off by default) the first skipped step of a run
is replayed with TensorFlow's numeric checks on (`deep_look`), and one
more line names the first op that made a NaN or Inf, its layer and its
pass, e.g. `deep look at step 0: first Inf: Cast (float16)
gradient_tape/net/Cast_1/Cast in the backward pass, layer out, fed by
...; finite at scale 1: float16 overflow` (replayed at scale 1 too: the
scale made it). Where that finds overflow but the source layer's
gradients hold NaN only (a convolution's, an LSTM's), the first line says
`Inf entered` (`SkipRecord.entered`), not the record's NaN; where it finds
a real NaN (non-finite at scale 1 too), the line drops its overflow
remark. For that the train step hands its batch back with its logs while
`fit` runs (`deep_look.KeptBatch`: no op, no copy); the replay runs only
after a skipped step and changes nothing (variables, optimizer slots, the
scale, `iterations`, the random state). Under `MirroredStrategy` each
replica hands back its own batch, and the replay is of the batch of the
replica the record names (`deep look at step 0, replica 1's batch: ...`);
under other strategies of several replicas none is kept (the line says so).

With `max_consecutive_skips=K` it stops training after K skipped steps in a
row and warns once: a scale that keeps falling while every step is skipped
is a NaN or Inf that no loss scale can fix (bad data or a bug), not float16
overflow.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import warnings
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import keras
import tensorflow as tf

from tf_lossscale import _checks, skip_record
from tf_lossscale import deep_look as deep_look_lib
from tf_lossscale import optimizer as optimizer_lib
from tf_lossscale import settings as settings_lib

__all__ = ["LOGGED_KEYS", "LossScaleMonitor"]

# The keys the monitor adds to `logs`.
LOGGED_KEYS = ("loss_scale", "skipped_steps", "skip_streak",
               "nonfinite_gradients")


def _read_int(value: Any) -> int:
    """An int from a tensor or a (Keras or distributed) variable."""
    return int(tf.convert_to_tensor(value))


class LossScaleMonitor(keras.callbacks.Callback):
    """Logs `loss_scale` and `skipped_steps`; optionally stops on a skip run.

    Usage:

        model.compile(optimizer=tf_lossscale.LossScaleOptimizer(...), ...)
        model.fit(x, y, callbacks=[
            tf_lossscale.LossScaleMonitor(max_consecutive_skips=100),
            keras.callbacks.CSVLogger("log.csv"),      # after the monitor
            keras.callbacks.TensorBoard("logs")])      # after the monitor

    `loss_scale` is the scale after the batch's step(s), `skipped_steps`
    the optimizer's count of skipped steps since it was created (so it
    carries on across `fit` calls). `fit`'s own progress bar and `History`
    show them wherever the monitor is in the list (`fit` adds them last);
    every callback you pass sees them only when listed after the monitor.

    Args:
      max_consecutive_skips: None (never stop), or an int >= 1: stop
        training (`model.stop_training = True`) after that many skipped
        steps in a row, with one warning naming the step and the scale.
      report: print a line when a run of skipped steps begins (which
        gradients were NaN or Inf, the scale), and one when such a run
        reaches `min_scale`; the lines are kept in `lines` too.
      print_fn: what prints a line (default `print`).
      deep_look: on the first skipped step of a run, replay its batch with
        numeric checks on and say which op made the first NaN or Inf (its
        layer, forward or backward pass). Off by default; costs nothing
        until a step is skipped. On one replica or under
        `MirroredStrategy` (the batch of the replica the record names);
        not under other strategies of several replicas (the line says so).

    Raises:
      ValueError: `max_consecutive_skips` is not None or an int >= 1.
      TypeError (when training begins): the model's optimizer is not a
        `tf_lossscale.LossScaleOptimizer`.
    """

    def __init__(self, max_consecutive_skips: Optional[int] = None, *,
                 report: bool = True,
                 print_fn: Callable[[str], Any] = print,
                 deep_look: bool = False) -> None:
        super().__init__()
        if not isinstance(deep_look, bool):
            raise TypeError(
                "LossScaleMonitor's deep_look must be True or False; got "
                f"{deep_look!r} of type {type(deep_look).__name__}.")
        self.deep_look = deep_look
        self._kept: Optional[deep_look_lib.KeptBatch] = None
        self._kept_said = False
        self._unkept: Optional[str] = None  # Why no batch is kept.
        self.report = report
        self.print_fn = print_fn
        self.lines: List[str] = []  # What it printed, in order.
        self._nonfinite = 0
        self._floor_said = False
        # The first record of the current run, if it left overflow and a
        # real NaN undecided; the source layers whose cure was said.
        self._undecided: Optional[skip_record.SkipRecord] = None
        self._cured_said: Set[str] = set()
        if max_consecutive_skips is not None:
            max_consecutive_skips = _checks.check_int(
                "max_consecutive_skips", max_consecutive_skips, minimum=1)
        self.max_consecutive_skips = max_consecutive_skips
        self._last_skipped = 0
        self._last_iterations = 0
        self._run = 0  # Skipped steps in a row so far.
        self._run_start_scale = 0.0  # The scale before the run's first.
        self._scale = 0.0
        self._warned = False

    # tf_keras' CallbackList asks every callback which hooks it implements,
    # and hands tensors only to those that say they take them.
    _supports_tf_logs = False

    def _implements_train_batch_hooks(self) -> bool:
        return True

    def _implements_test_batch_hooks(self) -> bool:
        return False

    def _implements_predict_batch_hooks(self) -> bool:
        return False

    def _optimizer(self) -> optimizer_lib.LossScaleOptimizer:
        optimizer = getattr(self.model, "optimizer", None)
        if not isinstance(optimizer, optimizer_lib.LossScaleOptimizer):
            raise TypeError(
                "LossScaleMonitor needs a model compiled with a "
                "tf_lossscale.LossScaleOptimizer (wrap the optimizer: "
                "tf_lossscale.LossScaleOptimizer(keras.optimizers.Adam())); "
                f"got optimizer {optimizer!r} of type "
                f"{type(optimizer).__name__}.")
        return optimizer

    def _read(self) -> Tuple[float, int, int]:
        """The scale, the skip count and `iterations`, read after a step."""
        optimizer: Any = self._optimizer()  # `iterations`: the flavour's.
        return (float(optimizer.loss_scale),
                _read_int(optimizer.skipped_steps),
                _read_int(optimizer.iterations))

    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        self._scale, self._last_skipped, self._last_iterations = self._read()
        self._run = 0
        self._warned = False
        self._undecided = None
        self._cured_said = set()
        for progbar in _tf_keras_progress_bars(self):
            progbar.stateful_metrics = set(progbar.stateful_metrics).union(
                LOGGED_KEYS)
        if self.deep_look:
            self._kept = deep_look_lib.KeptBatch()
            self._unkept = self._kept.install(self.model)
            if self._unkept is not None:
                self._kept = None

    def on_train_end(self, logs: Optional[Dict[str, Any]] = None) -> None:
        if self._kept is not None:
            self._kept.uninstall()
            self._kept = None

    def on_train_batch_end(self, batch: int,
                           logs: Optional[Dict[str, Any]] = None) -> None:
        scale, skipped, iterations = self._read()
        new = skipped - self._last_skipped
        steps = iterations - self._last_iterations
        self._nonfinite = 0
        if new and new >= steps:  # Every step of this batch was skipped.
            if not self._run:
                self._run_start_scale = self._scale
                self._floor_said = False
            self._report(new, scale, starts=not self._run,
                         iterations=iterations)
            self._run += new
        else:
            if self._run:
                self._cured(scale)
            if new:
                self._report(new, scale, starts=True,
                             iterations=iterations)
            # With several steps per batch (`steps_per_execution`), a batch
            # that skipped some of them may end on a skipped step; the run
            # restarts anyway, so the monitor may stop later, never early.
            self._run = 0
        if logs is not None:
            logs.update(loss_scale=scale, skipped_steps=skipped,
                        skip_streak=self._run,
                        nonfinite_gradients=self._nonfinite)
        self._last_skipped, self._last_iterations = skipped, iterations
        self._scale = scale
        if (self.max_consecutive_skips is not None
                and self._run >= self.max_consecutive_skips):
            self._stop(iterations, scale)

    def on_epoch_end(self, epoch: int,
                     logs: Optional[Dict[str, Any]] = None) -> None:
        if logs is not None:
            scale, skipped, _ = self._read()
            logs.update(loss_scale=scale, skipped_steps=skipped,
                        skip_streak=self._run,
                        nonfinite_gradients=self._nonfinite)

    def _report(self, new: int, scale: float, starts: bool,
                iterations: int) -> None:
        """Reads the last skip (a batch skipped); says so when a run begins
        or, once per run, when it reaches `min_scale`."""
        optimizer = self._optimizer()
        record = optimizer.last_skip
        if record is None:
            return
        self._nonfinite = record.count
        # Skipped although it already used the floor: no back-off helps.
        at_floor = optimizer.dynamic and record.scale <= max(
            optimizer.min_scale, settings_lib.SMALLEST_NORMAL_FLOAT32)
        if starts:
            looked = self._look(record, iterations) if self.deep_look else None
            shown = record
            found = looked[1] if looked is not None else None
            entered = _entered(record, found)
            if entered is not None:
                shown = dataclasses.replace(record, entered=entered)
            # An op the look found decides the run; the back-off cannot.
            self._undecided = (shown if shown.undecided and found is None
                               else None)
            self._say(f"{shown}{_change(record.scale, scale)}")
            if looked is not None:
                self._say(looked[0])
        if at_floor and not self._floor_said and record.streak > 1:
            self._floor_said = True
            self._say(
                f"steps {record.first_step}-{record.step}: "
                f"{record.streak} skipped in a row, the last at min_scale "
                f"({skip_record.scale_text(record.scale)}): "
                f"{record.verdict_at_floor()}; last: "
                f"{record.at_floor().summary()}")
            self._undecided = None

    def _cured(self, scale: float) -> None:
        """A run of skipped steps has ended with an applied step: if the
        record could not tell overflow from a real NaN, the back-off just
        did; said once per fit for each source layer."""
        start, self._undecided = self._undecided, None
        if start is None or start.source is None or (
                start.source in self._cured_said):
            return
        self._cured_said.add(start.source)
        self._say(_cured_line(start, self._run, scale))

    def _look(self, record: skip_record.SkipRecord, iterations: int
              ) -> Optional[Tuple[str, Optional[deep_look_lib.NonFiniteOp]]]:
        """The deep look at the skipped step, if it was the batch's last
        (its batch is the one kept): its line and the op it found, or None
        (nothing to say). The batch of the replica the record names, then,
        if the replay stayed finite and other replicas saw a non-finite
        gradient too, theirs in turn (tf_keras sums the replicas' gradients
        before the check, so every replica sees one and the record names
        replica 0 whichever batch made it)."""
        kept = self._kept
        if kept is None:
            if self._kept_said:
                return None
            self._kept_said = True
            return f"deep look: no batch kept ({self._unkept})", None
        if record.step != iterations - 1:
            return None  # An earlier step of the batch (steps_per_execution).
        order = [record.replica] + sorted(
            r for r in kept.batches
            if r != record.replica and record.replicas > 1)
        order = [r for r in order if r in kept.batches]
        if not order:
            return (f"deep look at step {record.step}: no batch of "
                    f"replica {record.replica} kept", None)
        found, tried = None, []
        for replica in order:
            tried.append(replica)
            found = deep_look_lib.replay_batch(
                self.model, kept.batches[replica], record.scale)
            if found is not None:
                break
        return _look_line(record.step, tried, found,
                          several=len(kept.batches) > 1), found

    def _say(self, line: str) -> None:
        self.lines.append(line)
        if not self.report:
            return
        # A progress bar (verbose=1) redraws its line with '\r' and ends
        # it only at the epoch's end: start a line of our own.
        params = getattr(self, "params", None) or {}
        bar = self.print_fn is print and params.get("verbose") == 1
        self.print_fn(("\n" if bar else "") + line)

    def _stop(self, step: int, scale: float) -> None:
        self.model.stop_training = True
        if self._warned:
            return
        self._warned = True
        optimizer = self._optimizer()
        if optimizer.dynamic and scale <= optimizer.min_scale:
            where = "at its floor, min_scale"
        elif scale < self._run_start_scale:
            where = f"down from {self._run_start_scale:g}"
        else:
            where = "unchanged"
        warnings.warn(
            f"LossScaleMonitor stopped training at step {step}: the last "
            f"{self._run} steps were all skipped for NaN/Inf gradients "
            f"(max_consecutive_skips={self.max_consecutive_skips}), and the "
            f"loss scale is now {scale:g} ({where}). float16 overflow goes "
            "away once the scale is low enough; a NaN or Inf that persists "
            "as the scale falls is likely not overflow but bad input data "
            "(a NaN or Inf in a batch), a log or division of zero, or a "
            "diverging learning rate.", RuntimeWarning, stacklevel=2)


def _change(before: float, after: float) -> str:
    """` -> 2^13` when the scale moved, else nothing."""
    if before == after or not before:
        return ""
    return f" -> {skip_record.scale_text(after)}"


def _tf_keras_progress_bars(callback: Any) -> List[Any]:
    """tf_keras' `ProgbarLogger`s of the callback list that runs `callback`.

    A callback is not told which list it is in, but tf_keras calls it from
    its `CallbackList`'s hook, a frame or two up: the list whose
    `callbacks` holds it. None found (a hook called by hand, or Keras 3,
    whose progress bar shows values as they are): none.
    """
    module = sys.modules.get("tf_keras")
    if module is None:
        return []
    list_type = module.callbacks.CallbackList
    progbar_type = module.callbacks.ProgbarLogger
    frame: Optional[types.FrameType] = sys._getframe(1)
    for _ in range(8):
        if frame is None:
            break
        for value in frame.f_locals.values():
            if isinstance(value, list_type) and any(
                    c is callback for c in value.callbacks):
                return [c for c in value.callbacks
                        if isinstance(c, progbar_type)]
        frame = frame.f_back
    return []


def _entered(record: skip_record.SkipRecord,
             found: Optional[deep_look_lib.NonFiniteOp]) -> Optional[str]:
    """What the deep look shows entered a backward fault: "Inf" where
    float16 overflow made it (its first non-finite op, in the backward
    pass, held an Inf, and the replay at scale 1 was finite), "NaN" where
    the record could not tell (`SkipRecord.undecided`) and the replay at
    scale 1 stayed non-finite (a real NaN); else None."""
    if found is None or not found.backward:
        return None
    if (found.overflow is True and "Inf" in found.kind
            and record.origin in ("backward", None)):
        return "Inf"
    if found.overflow is False and record.undecided:
        return record.source_kind
    return None


def _cured_line(start: skip_record.SkipRecord, skipped: int,
                scale: float) -> str:
    """What a run of skipped steps that began undecided and that the
    back-off ended says: overflow (unless only its batches were bad)."""
    first = start.first_step
    steps = (f"step {first}" if skipped == 1
             else f"steps {first}-{first + skipped - 1}")
    # One batch may have been bad alone; a run of them, each at a lower
    # scale, is overflow.
    alone = " (or a fault of that batch alone)" if skipped == 1 else ""
    return (f"{steps} skipped, and the next applied at "
            f"{skip_record.scale_text(scale)}: the NaN at {start.source} was "
            f"float16 overflow, which the back-off cured{alone}")


def _look_line(step: int, tried: List[int],
               found: Optional[deep_look_lib.NonFiniteOp],
               several: bool) -> str:
    """The deep look's line: `deep look at step 0: first Inf: ...`;
    with several replicas, whose batch it replayed (`, replica 1's batch
    (replica 0's stayed finite)`)."""
    where = ""
    if several and found is not None:
        finite = tried[:-1]
        before = (f" ({_replicas_text(finite)}'s stayed finite)"
                  if finite else "")
        where = f", replica {tried[-1]}'s batch{before}"
    elif several:
        where = f", {_replicas_text(tried)}'s batch"
    what = (found.describe() if found is not None else
            "every value was finite in the replay (the fault depends on a "
            "random draw, or came from another step)")
    return f"deep look at step {step}{where}: {what}"


def _replicas_text(replicas: List[int]) -> str:
    """`replica 0`, or `replicas 0, 2`."""
    if len(replicas) == 1:
        return f"replica {replicas[0]}"
    return f"replicas {', '.join(map(str, replicas))}"
