"""The few TensorFlow internals this package relies on, in one place.

`tf.train.Checkpoint` names a child by what an object's
`_trackable_children` returns. To write the same checkpoint keys as
TensorFlow's own `DynamicLossScale` (`current_loss_scale`, `good_steps`) while
keeping one pair of variables per TF1 graph, `LossScale` derives from the
base `Trackable` and overrides that protocol, exactly as TensorFlow does.
The protocol is stable since TF 2.10 but has no public spelling.
"""

import tensorflow as tf

Trackable = tf.__internal__.tracking.Trackable

__all__ = ["Trackable", "keras_iterations_variable",
           "strategy_supports_no_merge_call"]


def strategy_supports_no_merge_call() -> bool:
    """True when the current strategy updates variables without `merge_call`.

    Keras 3 optimizers choose their update path with this predicate (through
    `tf.__internal__.distribute.interim.maybe_merge_call`); the Keras
    `LossScaleOptimizer` must choose the same one, so that its apply-or-skip
    branch sits in the context (replica or cross-replica) where the inner
    update can run. It depends on the graph being traced (XLA), so call it
    where the step is traced. No public spelling.
    """
    return tf.__internal__.distribute.strategy_supports_no_merge_call()


def keras_iterations_variable(optimizer):
    """The variable in which a Keras 3 optimizer counts its `apply` calls.

    `optimizer.iterations` is that variable, except with
    `gradient_accumulation_steps`, where it is a tensor derived from it. A
    skipped loss-scaled step must advance the variable itself, as `apply`
    does for an applied one. Keras keeps it as `_iterations`, with no public
    spelling.
    """
    return optimizer._iterations
