"""Keras `fit` under a mixed precision policy, as in the TF 2.1-2.3 guide.

`model.compile` wraps the optimizer in a LossScaleOptimizer with the
policy's loss scale (dynamic for 'mixed_float16').
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
policy = mixed_precision.Policy('mixed_float16')
mixed_precision.set_policy(policy)
print('Compute dtype: %s' % policy.compute_dtype)
print('Variable dtype: %s' % policy.variable_dtype)

inputs = keras.Input(shape=(8,), name='features')
x = layers.Dense(32, activation='relu', name='dense_1')(inputs)
x = layers.Dense(1, name='dense_logits')(x)
# The output layer computes in float32 for numeric stability.
outputs = layers.Activation('linear', dtype='float32', name='predictions')(x)
model = keras.Model(inputs=inputs, outputs=outputs)
model.compile(loss='mse', optimizer=keras.optimizers.SGD(learning_rate=0.05))

rng = np.random.RandomState(0)
x_train = rng.randn(512, 8).astype('float32')
y_train = x_train @ rng.randn(8, 1).astype('float32')
initial_loss = model.evaluate(x_train, y_train, batch_size=512, verbose=0)
losses = []
log_losses = keras.callbacks.LambdaCallback(
  on_train_batch_end=lambda batch, logs: losses.append(
      float(logs['loss'])))
history = model.fit(x_train, y_train, batch_size=64, epochs=8, verbose=0,
                    callbacks=[log_losses])
opt_class = type(model.optimizer)
print('optimizer: %s.%s' % (opt_class.__module__, opt_class.__name__))
print(json.dumps({'losses': losses, 'weights': [
    float(w) for v in model.trainable_variables
    for w in v.numpy().ravel()[:8]]}))
print('initial loss %.5f' % initial_loss)
print('compute dtype %s' % model.get_layer('dense_1').compute_dtype)
final_loss = history.history['loss'][-1]
print('final loss %.5f' % final_loss)
if model.get_layer('dense_1').compute_dtype != 'float16':
  raise SystemExit('the policy did not reach the layers')
if not final_loss < initial_loss / 5:
  raise SystemExit('the model did not learn')
