"""Reading a policy's loss scale, as the TF 2.2 mixed precision guide did.

TF 2.1-2.3's `Policy` carried the loss scale that `model.compile` wrapped
the optimizer with; the guide printed it, and the optimizer's. Both are
`LossScale` objects, which the current API no longer has: `migrate` names
these lines (and exits 1) instead of converting them.
"""
import json
import random
import sys

import numpy as np
import tensorflow as tf
from tensorflow import keras
from tensorflow.keras import layers
from tensorflow.keras.mixed_precision import experimental as mixed_precision

random.seed(8)
np.random.seed(8)
tf.random.set_seed(8)

policy = mixed_precision.Policy('mixed_float16')
mixed_precision.set_policy(policy)
print('Compute dtype: %s' % policy.compute_dtype)
print('Variable dtype: %s' % policy.variable_dtype)
loss_scale = policy.loss_scale
print('Loss scale: %s' % loss_scale)
new_policy = mixed_precision.Policy('mixed_float16', loss_scale=1024)
print(new_policy.loss_scale)

inputs = keras.Input(shape=(12,))
x = layers.Dense(32, activation='relu')(inputs)
x = layers.Dense(1)(x)
outputs = layers.Activation('linear', dtype='float32')(x)
model = keras.Model(inputs=inputs, outputs=outputs)
model.compile(loss='mse', optimizer=keras.optimizers.SGD(0.02))

rng = np.random.RandomState(8)
x_train = rng.randn(512, 12).astype('float32')
y_train = x_train[:, :2].sum(axis=1, keepdims=True)
initial_loss = model.evaluate(x_train, y_train, batch_size=512, verbose=0)
losses = []
log_losses = keras.callbacks.LambdaCallback(
  on_train_batch_end=lambda batch, logs: losses.append(
      float(logs['loss'])))
history = model.fit(x_train, y_train, batch_size=32, epochs=4, verbose=0,
                    shuffle=False, callbacks=[log_losses])
print('Optimizer loss scale: %s' % model.optimizer.loss_scale)
print('optimizer: %s.%s' % (type(model.optimizer).__module__,
                            type(model.optimizer).__name__))
print(json.dumps({'losses': losses, 'weights': [
    float(w) for v in model.trainable_variables
    for w in v.numpy().ravel()[:8]]}))
final_loss = history.history['loss'][-1]
print('initial loss %.5f' % initial_loss)
print('final loss %.5f' % final_loss)
if not final_loss < initial_loss / 4:
  sys.exit('the model did not learn')
