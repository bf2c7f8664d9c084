"""`Stop`: the stop when stuck, one for every optimizer of the package.

With `max_consecutive_skips=K` (None: never), the step that completes K
skipped steps in a row fails, naming the variables whose gradients were
non-finite and the scale. The Keras flavours (through `telemetry`) and the
TF1 `MixedPrecisionLossScaleOptimizer` use this one rule and message:

- eagerly, `raise_if_stuck` (after the step) raises `SkipStreakError`,
  carrying the last `SkipRecord`;
- inside a `tf.function`, `check` (in the skip branch, once the record is
  written) fails the step: it surfaces as `tf.errors.InvalidArgumentError`,
  the base class of `SkipStreakError`, with the message's graph form (the
  record's description needs the host): TensorFlow rebuilds no exception
  type of ours from a graph;
- under XLA (`jit_compile=True`), which drops graph assertions and has no
  string op, the caller leaves `check` out: `raise_if_stuck()` after the
  step does it with one host read of a few scalars.

In a TF1 graph (`tf.compat.v1.Session`) there is no record (see
`v1_skip_record`): `counter()` gives that graph a run-of-skips counter of
its own, a variable of the graph, which the skip branch advances and the
apply branch zeroes; `check` then runs on it.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import tensorflow as tf

from tf_lossscale import skip_record

__all__ = ["Stop"]


class Stop:
    """Skipped steps in a row against `limit` (`max_consecutive_skips`)."""

    def __init__(self, limit: Optional[int]) -> None:
        self.limit = limit
        # TF1 graph (None: eager and every `tf.function`) -> its counter.
        self._counters: Dict[Any, tf.Variable] = {}

    def check(self, streak: Any, scale: Any, names: Sequence[str],
              indices: Any, step: Any = None) -> Any:
        """An assertion that fails the traced step once `streak` reaches
        the limit.

        `scale`: the scale the step used; `indices`: int32 positions in
        `names` of the non-finite gradients (-1: none); `step`: the step's
        number, if counted (the TF1 graph counts none).
        """
        limit = self.limit
        streak = tf.convert_to_tensor(streak)
        indices = tf.convert_to_tensor(indices)
        table = tf.constant(list(names) + ["?"])
        picked = tf.gather(table, tf.where(indices < 0, len(names), indices))
        picked = tf.boolean_mask(picked, indices >= 0)
        last: list = (["the last used scale "] if step is None else [
            "the last, step ",
            tf.strings.as_string(tf.convert_to_tensor(step)),
            ", used scale "])
        message = tf.strings.join([
            f"{skip_record.SkipStreakError.__name__}: ",
            tf.strings.as_string(streak),
            f" steps in a row were skipped (max_consecutive_skips={limit}); ",
            *last,
            tf.strings.as_string(tf.convert_to_tensor(scale), shortest=True),
            " and had non-finite gradients: ",
            tf.strings.reduce_join(picked, separator=", ")])
        return tf.debugging.Assert(streak < limit, [message])

    def raise_if_stuck(self, record: Optional[skip_record.SkipRecord],
                       steps: Callable[[], Any], scale: Callable[[], Any],
                       floor: Optional[float]) -> None:
        """Raises `SkipStreakError` if `record` ends a run of `limit`
        skipped steps that no later step ended.

        `steps()`: the step counter the record's `step` counts in (read
        only if the run is long enough); `scale()`: the scale now;
        `floor`: the smallest a dynamic scale gets (None: fixed scale).
        """
        limit = self.limit
        if limit is None or record is None or record.streak < limit:
            return
        # A later step (applied) ended the run; inside a failed traced step
        # the counter may or may not have advanced past the record.
        if record.step + 1 < int(tf.convert_to_tensor(steps())):
            return
        now = float(tf.convert_to_tensor(scale()))
        floored = floor is not None and now <= floor
        at_floor = (f" It is at min_scale: {record.verdict_at_floor()}."
                    if floored else "")
        last = record.at_floor() if floored else record
        raise skip_record.SkipStreakError(
            f"{record.streak} steps in a row were skipped "
            f"(max_consecutive_skips={limit}), steps {record.first_step} to "
            f"{record.step}; the last: {last}; the scale is now "
            f"{skip_record.scale_text(now)}.{at_floor}", record)

    def counter(self) -> tf.Variable:
        """The run-of-skips counter of the current TF1 graph (made once
        per graph), for steps that keep no record."""
        graph = tf.compat.v1.get_default_graph()
        if graph not in self._counters:
            with tf.init_scope():
                self._counters[graph] = tf.Variable(
                    0, dtype=tf.int64, trainable=False, name="skip_streak",
                    aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        return self._counters[graph]

    def counting(self, apply: Callable[[], Any], skip: Callable[[], Any],
                 scale: Any, names: Sequence[str],
                 nonfinite: Callable[[], Any]
                 ) -> Tuple[Callable[[], Any], Callable[[], Any]]:
        """`apply` that zeroes this graph's counter, and `skip` that
        advances it and fails the step at the limit (a TF1 graph's steps).

        `nonfinite()`: a bool per name, whether that gradient held a NaN or
        an Inf (run in the skip branch only).
        """
        streak = self.counter()

        def apply_and_reset() -> Any:
            with tf.control_dependencies(tf.nest.flatten(apply())):
                return streak.assign(0)

        def count_and_check() -> Any:
            count = streak.assign_add(1)
            indices = tf.cast(tf.where(nonfinite())[:, 0], tf.int32)
            with tf.control_dependencies(
                    [self.check(count, scale, names, indices)]):
                return tf.group(skip(), tf.identity(count))

        return apply_and_reset, count_and_check
