"""Saving a compiled mixed precision model and loading it to go on training.

TF 2.4-2.15 code compiled under the 'mixed_float16' policy, trained,
saved the whole model (its optimizer wrapped by compile included) with
`model.save`, loaded it with `tf.keras.models.load_model`, checked that the
loaded optimizer is a `LossScaleOptimizer` and trained on.
"""
import json
import os
import random
import sys
import tempfile

import numpy as np
import tensorflow as tf
from tensorflow.keras import mixed_precision

random.seed(14)
np.random.seed(14)
tf.random.set_seed(14)
mixed_precision.set_global_policy('mixed_float16')

rng = np.random.RandomState(14)
x_train = rng.randn(512, 8).astype('float32')
y_train = np.argmax(x_train[:, :3], axis=1)

inputs = tf.keras.Input(shape=(8,))
hidden = tf.keras.layers.Dense(32, activation='relu')(inputs)
logits = tf.keras.layers.Dense(3)(hidden)
outputs = tf.keras.layers.Activation('softmax', dtype='float32')(logits)
model = tf.keras.Model(inputs, outputs)
model.compile(optimizer=tf.keras.optimizers.Adam(learning_rate=2e-2),
              loss='sparse_categorical_crossentropy', metrics=['accuracy'])
initial_loss = model.evaluate(x_train, y_train, verbose=0)[0]
losses = []
log_losses = tf.keras.callbacks.LambdaCallback(
    on_train_batch_end=lambda batch, logs: losses.append(
        float(logs['loss'])))
model.fit(x_train, y_train, batch_size=64, epochs=4, verbose=0, shuffle=False,
          callbacks=[log_losses])

path = os.path.join(tempfile.mkdtemp(), 'model.keras')
model.save(path)
loaded = tf.keras.models.load_model(path)
optimizer = loaded.optimizer
if not isinstance(optimizer, mixed_precision.LossScaleOptimizer):
    sys.exit('the loaded optimizer is not a LossScaleOptimizer')
print('loaded %s, dynamic=%s, inner %s' % (
    type(optimizer).__name__, optimizer.dynamic,
    type(optimizer.inner_optimizer).__name__))
before = model.evaluate(x_train, y_train, verbose=0)[0]
after = loaded.evaluate(x_train, y_train, verbose=0)[0]
if abs(before - after) > 1e-4:
    sys.exit('the loaded model differs from the saved one')
history = loaded.fit(x_train, y_train, batch_size=64, epochs=4, verbose=0,
                     shuffle=False, callbacks=[log_losses])
print('optimizer: %s.%s' % (type(optimizer).__module__,
                            type(optimizer).__name__))
print(json.dumps({'losses': losses, 'weights': [
    float(w) for v in loaded.trainable_variables
    for w in v.numpy().ravel()[:8]]}))
final_loss = history.history['loss'][-1]
print('initial loss %.5f' % initial_loss)
print('final loss %.5f' % final_loss)
if not final_loss < initial_loss / 3:
    sys.exit('the model did not learn')
