"""A custom training loop with the TF 2.4-2.15 LossScaleOptimizer.

As the TF 2.4 guide wrote it: the optimizer is wrapped explicitly, the loss
scaled with `get_scaled_loss` inside the tape and the gradients unscaled
with `get_unscaled_gradients` before `apply_gradients`.
"""
import json
import random
import sys

import numpy as np
import tensorflow as tf
from tensorflow import keras
from tensorflow.keras import layers
from tensorflow.keras import mixed_precision

random.seed(2)
np.random.seed(2)
tf.random.set_seed(2)
mixed_precision.set_global_policy('mixed_float16')

model = keras.Sequential([
    keras.Input(shape=(10,)),
    layers.Dense(32, activation='relu'),
    layers.Dense(3),
    layers.Activation('softmax', dtype='float32'),
])
optimizer = keras.optimizers.Adam(learning_rate=3e-3)
optimizer = mixed_precision.LossScaleOptimizer(optimizer)
loss_object = keras.losses.SparseCategoricalCrossentropy()

rng = np.random.RandomState(2)
x_train = rng.randn(768, 10).astype('float32')
y_train = (x_train[:, 0] > 0).astype('int64') + (x_train[:, 1] > 1)
train_dataset = tf.data.Dataset.from_tensor_slices(
    (x_train, y_train)).batch(64)


@tf.function
def train_step(x, y):
  with tf.GradientTape() as tape:
    predictions = model(x)
    loss = loss_object(y, predictions)
    scaled_loss = optimizer.get_scaled_loss(loss)
  scaled_gradients = tape.gradient(scaled_loss, model.trainable_variables)
  gradients = optimizer.get_unscaled_gradients(scaled_gradients)
  optimizer.apply_gradients(zip(gradients, model.trainable_variables))
  return loss


def evaluate():
  return float(loss_object(y_train, model(x_train, training=False)))


initial_loss = evaluate()
losses = []
for epoch in range(5):
  for x, y in train_dataset:
    losses.append(float(train_step(x, y)))
print('optimizer: %s.%s' % (type(optimizer).__module__,
                            type(optimizer).__name__))
print('loss scale %g' % float(optimizer.loss_scale))
print(json.dumps({'losses': losses, 'weights': [
    float(w) for v in model.trainable_variables
    for w in v.numpy().ravel()[:8]]}))
final_loss = evaluate()
print('initial loss %.5f' % initial_loss)
print('final loss %.5f' % final_loss)
if not final_loss < initial_loss / 2:
  sys.exit('the model did not learn')
