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

__all__ = ["Trackable"]
