"""`last_skip` of the TF1 `MixedPrecisionLossScaleOptimizer`, outside a TF1 graph.

The Keras flavours' record (`skip_record`), made and written where the TF1
optimizer runs eagerly or inside a `tf.function` (TF2 code that kept its
TF1 optimizer). Its update runs in a cross-replica context, so the skip
branch records every replica's gradients at once (`record_replicas`). The
TF1 optimizer has no `iterations` (`global_step` counts applied steps
only), so a step counter of its own, one scalar add per step, gives the
record its `step`: the number of `apply_gradients` steps before the skipped
one, skipped ones included.

In a TF1 graph (`tf.compat.v1.Session`) there is no record and `last_skip`
is None: its variables would be variables of the user's graph, and a graph
variable is either in `GLOBAL_VARIABLES`, where `tf.compat.v1.train.Saver`
saves it (a Saver checkpoint would then no longer restore into a graph
built with TensorFlow's optimizer, nor back), or outside it, where
`global_variables_initializer` does not initialize it (and the first
skipped step would fail on an uninitialized read).
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

import tensorflow as tf

from tf_lossscale import skip_record
from tf_lossscale.gradient_check import variable_name

__all__ = ["V1SkipRecord"]


class V1SkipRecord:
    """The record's variables, the step counter and the variables' names."""

    def __init__(self) -> None:
        self.variables = skip_record.make_variables()
        with tf.init_scope():
            self.steps = tf.Variable(
                0, dtype=tf.int64, trainable=False, name="skip_record_steps",
                synchronization=tf.VariableSynchronization.ON_WRITE,
                aggregation=tf.VariableAggregation.NONE)
        self.names: List[str] = []

    @staticmethod
    def available() -> bool:
        """Whether a step built here can record (not in a TF1 graph)."""
        return tf.executing_eagerly() or tf.inside_function()

    def recording(self, skip: Callable[[], Any], grads_and_vars: Sequence[Any],
                  strategy: tf.distribute.Strategy, scale: tf.Tensor,
                  check: Optional[Callable[[skip_record.RecordVariables,
                                            List[str]], Any]] = None
                  ) -> Callable[[], Any]:
        """`skip`, preceded by recording the step's gradients and, with
        `check` (the stop's), running it on the written record and the
        names; notes the variables' names (the record holds their
        indices)."""
        present = [(g, v) for g, v in grads_and_vars if g is not None]
        self.names = names = [variable_name(v) for _, v in present]
        local = [strategy.experimental_local_results(g) for g, _ in present]

        def record_then_skip() -> Any:
            per_replica = [[values[r] for values in local]
                           for r in range(len(local[0]))]
            written = skip_record.record_replicas(
                self.variables, per_replica, tf.convert_to_tensor(self.steps),
                scale)
            done = [written]
            if check is not None:
                with tf.control_dependencies([written]):
                    done.append(check(self.variables, list(names)))
            with tf.control_dependencies(done):
                return skip()

        return record_then_skip

    def count_step(self) -> Any:
        """Advances the step counter (after the step's apply or skip)."""
        return self.steps.assign_add(1)

    def read(self) -> Optional[skip_record.SkipRecord]:
        """The last skipped step, or None (one host read)."""
        return skip_record.read(self.variables, self.names)
