"""A custom training loop with loss scaling, as in the TF 2.1-2.3 guide.

The loss is scaled before differentiation and the gradients unscaled
after, with the optimizer's get_scaled_loss / get_unscaled_gradients.
"""
import json
import random

import numpy as np
import tensorflow as tf
from tensorflow import keras
from tensorflow.keras import layers
from tensorflow.keras.mixed_precision import experimental as mixed_precision

random.seed(0)  # Keras draws its initializer seeds from Python's random.
np.random.seed(0)
tf.random.set_seed(0)
mixed_precision.set_policy('mixed_float16')

model = keras.Sequential([
    keras.Input(shape=(8,)),
    layers.Dense(32, activation='relu'),
    layers.Dense(1),
    layers.Activation('linear', dtype='float32'),
])
optimizer = keras.optimizers.SGD(learning_rate=0.05)
optimizer = mixed_precision.LossScaleOptimizer(optimizer, loss_scale='dynamic')
loss_object = keras.losses.MeanSquaredError()


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


rng = np.random.RandomState(0)
x_train = rng.randn(512, 8).astype('float32')
y_train = x_train @ rng.randn(8, 1).astype('float32')
dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train)).batch(64)

initial_loss = float(loss_object(y_train, model(x_train)))
losses = []
for epoch in range(8):
  for x, y in dataset:
    loss = train_step(x, y)
    losses.append(float(loss))
print('optimizer: %s.%s' % (type(optimizer).__module__,
                            type(optimizer).__name__))
print(json.dumps({'losses': losses, 'weights': [
    float(w) for v in model.trainable_variables
    for w in v.numpy().ravel()[:8]]}))
print('initial loss %.5f' % initial_loss)
final_loss = float(loss_object(y_train, model(x_train)))
print('final loss %.5f' % final_loss)
if not final_loss < initial_loss / 5:
  raise SystemExit('the model did not learn')
