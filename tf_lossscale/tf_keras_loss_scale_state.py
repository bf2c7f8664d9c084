"""The `loss_scale` child both tf_keras flavours add to their inner optimizer.

tf_keras' wrapper is, to a checkpoint, its inner optimizer plus a child
`loss_scale` holding the dynamic scale's `current_loss_scale` and
`good_steps`; both tf_keras flavours (`tf_keras_optimizer`,
`tf_keras_legacy_optimizer`) track theirs the same way, through
`track_loss_scale_state`, so a `tf.train.Checkpoint` written with tf_keras'
`LossScaleOptimizer`, or with the bare inner optimizer, restores into ours
and back.

It imports no flavour: both flavours import it.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tf_lossscale import _tf_private
from tf_lossscale import optimizer as optimizer_lib
from tf_lossscale import settings as settings_lib
from tf_lossscale import step as step_lib

__all__ = [
    "LossScaleState",
    "track_loss_scale_state",
]


class LossScaleState(tf.Module):
    """The dynamic loss scale's variables, under TensorFlow's checkpoint keys.

    `current_loss_scale` (float32) and `good_steps` (int64) are the names
    tf_keras' and TensorFlow's loss scales write, so checkpoints interchange;
    `bad_steps` exists only with hysteresis. All aggregate with NONE: every
    replica assigns the same agreed value.
    """

    def __init__(self, initial_scale: float, hysteresis: bool) -> None:
        super().__init__(name="loss_scale")
        self.current_loss_scale = self._variable(
            initial_scale, tf.float32, "current_loss_scale")
        self.good_steps = self._variable(0, tf.int64, "good_steps")
        if hysteresis:
            self.bad_steps = self._variable(0, tf.int64, "bad_steps")

    @staticmethod
    def _variable(value: Any, dtype: tf.DType, name: str) -> tf.Variable:
        return tf.Variable(
            value, dtype=dtype, name=name, trainable=False,
            synchronization=tf.VariableSynchronization.AUTO,
            aggregation=tf.VariableAggregation.NONE)


def track_loss_scale_state(inner_optimizer: Any,
                           settings: settings_lib.Settings
                           ) -> step_lib.ScaleVariables:
    """Creates the scale's variables; the checkpointed ones under the inner
    optimizer's `loss_scale` child (we are the inner optimizer, to a
    checkpoint), as tf_keras' wrapper does."""
    skipped = optimizer_lib.skipped_steps_variable()
    if not settings.dynamic:
        return step_lib.ScaleVariables(skipped=skipped)
    state = LossScaleState(settings.initial_scale,
                           settings.rule().needs_bad_steps)
    _tf_private.track_child(inner_optimizer, state, "loss_scale")
    return step_lib.ScaleVariables(
        state.current_loss_scale, state.good_steps,
        getattr(state, "bad_steps", None), skipped)
