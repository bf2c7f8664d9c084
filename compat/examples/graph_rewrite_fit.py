"""Keras fit with TF 2.1-2.3's mixed precision graph rewrite.

`tf.train.experimental.enable_mixed_precision_graph_rewrite` wraps the Keras
optimizer in a loss-scale optimizer and turns on TensorFlow's own
`auto_mixed_precision` graph rewrite (which casts to float16 on GPUs; on a
CPU it leaves the graph in float32).
"""
import json
import random
import sys

import numpy as np
import tensorflow as tf

random.seed(5)
np.random.seed(5)
tf.random.set_seed(5)

model = tf.keras.models.Sequential([
    tf.keras.layers.Dense(32, activation='relu', input_shape=(8,)),
    tf.keras.layers.Dense(1),
])
opt = tf.keras.optimizers.Adam(learning_rate=1e-2)
opt = tf.train.experimental.enable_mixed_precision_graph_rewrite(opt)
model.compile(loss='mse', optimizer=opt)
print('auto_mixed_precision: %s' % (
    tf.config.optimizer.get_experimental_options()['auto_mixed_precision'],))

rng = np.random.RandomState(5)
x_train = rng.randn(512, 8).astype('float32')
y_train = np.tanh(x_train[:, :3]).sum(axis=1, keepdims=True)
initial_loss = model.evaluate(x_train, y_train, batch_size=512, verbose=0)
losses = []
log_losses = tf.keras.callbacks.LambdaCallback(
  on_train_batch_end=lambda batch, logs: losses.append(
      float(logs['loss'])))
history = model.fit(x_train, y_train, batch_size=32, epochs=4, verbose=0,
                    shuffle=False, callbacks=[log_losses])
tf.train.experimental.disable_mixed_precision_graph_rewrite()
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
