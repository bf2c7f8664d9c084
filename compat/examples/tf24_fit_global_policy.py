"""Keras fit with the TF 2.4-2.15 mixed precision API, as in that guide.

`set_global_policy('mixed_float16')` makes `model.compile` wrap the
optimizer in a `tf.keras.mixed_precision.LossScaleOptimizer`, which the
script then inspects.
"""
import json
import random
import sys

import numpy as np
import tensorflow as tf
from tensorflow import keras
from tensorflow.keras import layers
from tensorflow.keras import mixed_precision

random.seed(1)  # Keras 3 draws its initializer seeds from Python's random.
np.random.seed(1)
tf.random.set_seed(1)
mixed_precision.set_global_policy('mixed_float16')

inputs = keras.Input(shape=(16,), name='features')
x = layers.Dense(64, activation='relu', name='dense_1')(inputs)
x = layers.Dense(64, activation='relu', name='dense_2')(x)
x = layers.Dense(4, name='dense_logits')(x)
# The softmax runs in float32 for numeric stability.
outputs = layers.Activation('softmax', dtype='float32', name='predictions')(x)
model = keras.Model(inputs=inputs, outputs=outputs)
model.compile(loss='sparse_categorical_crossentropy',
              optimizer=keras.optimizers.RMSprop(learning_rate=1e-3),
              metrics=['accuracy'])

rng = np.random.RandomState(1)
x_train = rng.randn(1024, 16).astype('float32')
y_train = np.argmax(x_train[:, :4], axis=1)
initial_loss = model.evaluate(x_train, y_train, batch_size=1024, verbose=0)[0]
losses = []
log_losses = keras.callbacks.LambdaCallback(
  on_train_batch_end=lambda batch, logs: losses.append(
      float(logs['loss'])))
history = model.fit(x_train, y_train, batch_size=64, epochs=6, verbose=0,
                    shuffle=False, callbacks=[log_losses])

optimizer = model.optimizer
if not isinstance(optimizer, mixed_precision.LossScaleOptimizer):
  sys.exit('compile did not wrap the optimizer in a LossScaleOptimizer')
print('optimizer: %s.%s' % (type(optimizer).__module__,
                            type(optimizer).__name__))
print(json.dumps({'losses': losses, 'weights': [
    float(w) for v in model.trainable_variables
    for w in v.numpy().ravel()[:8]]}))
print('compute dtype %s' % model.layers[1].compute_dtype)
print('loss scale %g after %d good steps' % (float(optimizer.loss_scale),
                                             int(optimizer.dynamic_counter)))
final_loss = history.history['loss'][-1]
print('initial loss %.5f' % initial_loss)
print('final loss %.5f' % final_loss)
if not final_loss < initial_loss / 3:
  sys.exit('the model did not learn')
