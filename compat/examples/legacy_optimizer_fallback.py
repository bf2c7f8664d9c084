"""A `tf.keras.optimizers.legacy` optimizer in a LossScaleOptimizer.

TF 2.11-2.15 code kept the OptimizerV2 family with
`tf.keras.optimizers.legacy.Adam` where it could (falling back to
`tf.keras.optimizers.Adam` where that namespace did not work), wrapped it in
`tf.keras.mixed_precision.LossScaleOptimizer` and trained in a custom loop,
reading `optimizer.inner_optimizer` for its learning rate.
"""
import json
import random
import sys

import numpy as np
import tensorflow as tf
from tensorflow.keras import mixed_precision

random.seed(16)
np.random.seed(16)
tf.random.set_seed(16)
mixed_precision.set_global_policy('mixed_float16')


def make_adam(learning_rate):
    try:
        return tf.keras.optimizers.legacy.Adam(learning_rate=learning_rate)
    except (AttributeError, ImportError):  # No OptimizerV2 in this Keras.
        return tf.keras.optimizers.Adam(learning_rate=learning_rate)


model = tf.keras.Sequential([
    tf.keras.Input(shape=(6,)),
    tf.keras.layers.Dense(24, activation='relu'),
    tf.keras.layers.Dense(1, dtype='float32'),
])
optimizer = mixed_precision.LossScaleOptimizer(make_adam(5e-3))
print('inner optimizer: %s.%s' % (type(optimizer.inner_optimizer).__module__,
                                  type(optimizer.inner_optimizer).__name__))
mse = tf.keras.losses.MeanSquaredError()


@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = mse(y, model(x, training=True))
        scaled_loss = optimizer.get_scaled_loss(loss)
    grads = tape.gradient(scaled_loss, model.trainable_variables)
    grads = optimizer.get_unscaled_gradients(grads)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


rng = np.random.RandomState(16)
x_train = rng.randn(512, 6).astype('float32')
y_train = np.sin(x_train[:, :2]).sum(axis=1, keepdims=True)
dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train)).batch(32)
initial_loss = float(mse(y_train, model(x_train)))
losses = []
for epoch in range(6):
    for x, y in dataset:
        losses.append(float(train_step(x, y)))
rate = float(tf.keras.backend.get_value(
    optimizer.inner_optimizer.learning_rate))
print('optimizer: %s.%s, lr %g' % (type(optimizer).__module__,
                                   type(optimizer).__name__, rate))
print(json.dumps({'losses': losses, 'weights': [
    float(w) for v in model.trainable_variables
    for w in v.numpy().ravel()[:8]]}))
final_loss = float(mse(y_train, model(x_train)))
print('initial loss %.5f' % initial_loss)
print('final loss %.5f' % final_loss)
if int(optimizer.iterations) != 6 * 16:
    sys.exit('iterations is not the number of steps')
if not final_loss < initial_loss / 4:
    sys.exit('the model did not learn')
