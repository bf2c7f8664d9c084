"""A custom loop under MirroredStrategy with loss scaling (TF 2.2 style).

Two logical CPUs stand in for two GPUs. Each replica scales its share of
the loss; the optimizer all-reduces the unscaled gradients.
"""
import json
import random

import numpy as np
import tensorflow as tf
from tensorflow import keras
from tensorflow.keras.mixed_precision import experimental as mixed_precision

cpu = tf.config.list_physical_devices('CPU')[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
random.seed(0)  # Keras draws its initializer seeds from Python's random.
np.random.seed(0)
tf.random.set_seed(0)
mixed_precision.set_policy('mixed_float16')

GLOBAL_BATCH_SIZE = 64
strategy = tf.distribute.MirroredStrategy(['/cpu:0', '/cpu:1'])
with strategy.scope():
  model = keras.Sequential([
      keras.Input(shape=(8,)),
      keras.layers.Dense(16, activation='relu'),
      keras.layers.Dense(1, dtype='float32'),
  ])
  optimizer = mixed_precision.LossScaleOptimizer(
      keras.optimizers.SGD(learning_rate=0.05), loss_scale='dynamic')

rng = np.random.RandomState(0)
x_train = rng.randn(512, 8).astype('float32')
y_train = x_train @ rng.randn(8, 1).astype('float32')
dataset = tf.data.Dataset.from_tensor_slices(
    (x_train, y_train)).batch(GLOBAL_BATCH_SIZE)
dist_dataset = strategy.experimental_distribute_dataset(dataset)


@tf.function
def train_step(dist_inputs):
  def step_fn(inputs):
    x, y = inputs
    with tf.GradientTape() as tape:
      predictions = model(x)
      loss = tf.reduce_sum(tf.square(predictions - y)) / GLOBAL_BATCH_SIZE
      scaled_loss = optimizer.get_scaled_loss(loss)
    scaled_gradients = tape.gradient(scaled_loss, model.trainable_variables)
    gradients = optimizer.get_unscaled_gradients(scaled_gradients)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    return loss
  per_replica_losses = strategy.run(step_fn, args=(dist_inputs,))
  return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses,
                         axis=None)


def full_loss():
  return float(np.mean(np.square(model(x_train).numpy() - y_train)))


initial_loss = full_loss()
losses = []
for epoch in range(4):
  for inputs in dist_dataset:
    losses.append(float(train_step(inputs)))
print('optimizer: %s.%s' % (type(optimizer).__module__,
                            type(optimizer).__name__))
print(json.dumps({'losses': losses, 'weights': [
    float(w) for v in model.trainable_variables
    for w in v.numpy().ravel()[:8]]}))
print('initial loss %.5f' % initial_loss)
final_loss = full_loss()
print('final loss %.5f' % final_loss)
if not final_loss < initial_loss / 5:
  raise SystemExit('the model did not learn')
