"""Resuming a custom loop from a `tf.train.CheckpointManager` checkpoint.

As TF 2.4-2.15 trainers did: the model and its
`tf.keras.mixed_precision.LossScaleOptimizer` are tracked by a
`tf.train.Checkpoint`, saved by a `CheckpointManager` partway through, and
restored into a freshly built model and optimizer (a new process would do
the same), which goes on training. The restored loss scale, its good-step
counter and the optimizer's step count must be the saved ones.
"""
import json
import random
import sys
import tempfile

import numpy as np
import tensorflow as tf
from tensorflow.keras import mixed_precision

random.seed(13)
np.random.seed(13)
tf.random.set_seed(13)
mixed_precision.set_global_policy('mixed_float16')

rng = np.random.RandomState(13)
x_train = rng.randn(256, 5).astype('float32')
y_train = np.tanh(x_train[:, :2]).sum(axis=1, keepdims=True)
dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train)).batch(32)
mse = tf.keras.losses.MeanSquaredError()


def build():
    model = tf.keras.Sequential([
        tf.keras.Input(shape=(5,)),
        tf.keras.layers.Dense(16, activation='tanh'),
        tf.keras.layers.Dense(1, dtype='float32'),
    ])
    optimizer = mixed_precision.LossScaleOptimizer(
        tf.keras.optimizers.Adam(learning_rate=1e-2),
        initial_scale=2 ** 10, dynamic_growth_steps=3)
    return model, optimizer


def make_step(model, optimizer):
    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = mse(y, model(x, training=True))
            scaled_loss = optimizer.get_scaled_loss(loss)
        grads = tape.gradient(scaled_loss, model.trainable_variables)
        grads = optimizer.get_unscaled_gradients(grads)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    return train_step


def full_loss(model):
    return float(mse(y_train, model(x_train)))


model, optimizer = build()
train_step = make_step(model, optimizer)
initial_loss = full_loss(model)
checkpoint_dir = tempfile.mkdtemp()
checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
manager = tf.train.CheckpointManager(checkpoint, checkpoint_dir, max_to_keep=2)
losses = []
for epoch in range(2):
    for x, y in dataset:
        losses.append(float(train_step(x, y)))
    manager.save(checkpoint_number=epoch)
saved = (float(optimizer.loss_scale), int(optimizer.dynamic_counter),
         int(optimizer.iterations), full_loss(model))
print('saved: loss scale %g, good steps %d, iterations %d' % saved[:3])

model, optimizer = build()
train_step = make_step(model, optimizer)
checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
status = checkpoint.restore(tf.train.latest_checkpoint(checkpoint_dir))
x0, y0 = next(iter(dataset))
mse(y0, model(x0))  # Builds the model, so the restore can match it.
restored = (float(optimizer.loss_scale), int(optimizer.dynamic_counter),
            int(optimizer.iterations))
print('restored: loss scale %g, good steps %d, iterations %d' % restored)
if restored != saved[:3]:
    sys.exit('the optimizer state was not restored')
if abs(full_loss(model) - saved[3]) > 1e-6:
    sys.exit('the model weights were not restored')
for epoch in range(4):
    for x, y in dataset:
        losses.append(float(train_step(x, y)))
status.assert_existing_objects_matched()
print('optimizer: %s.%s' % (type(optimizer).__module__,
                            type(optimizer).__name__))
print(json.dumps({'losses': losses, 'weights': [
    float(w) for v in model.trainable_variables
    for w in v.numpy().ravel()[:8]]}))
final_loss = full_loss(model)
print('initial loss %.5f' % initial_loss)
print('final loss %.5f' % final_loss)
if int(optimizer.iterations) != 6 * 8:
    sys.exit('the step count did not go on from the restored one')
if not final_loss < initial_loss / 4:
    sys.exit('the model did not learn')
