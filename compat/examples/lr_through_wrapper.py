"""Learning-rate control through a LossScaleOptimizer, as TF 2.4-2.15 code did.

`compile` wraps the optimizer under the 'mixed_float16' policy; Keras'
`LearningRateScheduler` callback then sets `model.optimizer.learning_rate`
each epoch, a custom callback logs the learning rate, the loss scale and
`dynamic_counter` from `model.optimizer`, and the script itself lowers the
rate through the wrapper (`optimizer.learning_rate = ...`) before a last
epoch. Each write must reach the inner optimizer.
"""
import json
import random
import sys

import numpy as np
import tensorflow as tf
from tensorflow.keras import mixed_precision

random.seed(15)
np.random.seed(15)
tf.random.set_seed(15)
mixed_precision.set_global_policy('mixed_float16')


def schedule(epoch, lr):
    return 0.1 if epoch == 0 else lr * 0.5


class LogOptimizer(tf.keras.callbacks.Callback):

    def __init__(self):
        super().__init__()
        self.rates = []

    def on_epoch_end(self, epoch, logs=None):
        optimizer = self.model.optimizer
        rate = float(tf.keras.backend.get_value(optimizer.learning_rate))
        inner = float(tf.keras.backend.get_value(
            optimizer.inner_optimizer.learning_rate))
        self.rates.append((rate, inner))
        print('epoch %d: lr %g (inner %g), loss scale %g, good steps %d' % (
            epoch, rate, inner, float(optimizer.loss_scale),
            int(optimizer.dynamic_counter)))


rng = np.random.RandomState(15)
x_train = rng.randn(512, 4).astype('float32')
y_train = (x_train ** 2).sum(axis=1, keepdims=True) / 4

model = tf.keras.Sequential([
    tf.keras.Input(shape=(4,)),
    tf.keras.layers.Dense(32, activation='relu'),
    tf.keras.layers.Dense(1, dtype='float32'),
])
model.compile(optimizer=tf.keras.optimizers.SGD(momentum=0.9), loss='mse')
initial_loss = model.evaluate(x_train, y_train, verbose=0)
log = LogOptimizer()
losses = []
log_losses = tf.keras.callbacks.LambdaCallback(
    on_train_batch_end=lambda batch, logs: losses.append(
        float(logs['loss'])))
model.fit(x_train, y_train, batch_size=32, epochs=3, verbose=0, shuffle=False,
          callbacks=[tf.keras.callbacks.LearningRateScheduler(schedule), log,
                     log_losses])
optimizer = model.optimizer
optimizer.learning_rate = 0.01
inner_rate = float(tf.keras.backend.get_value(
    optimizer.inner_optimizer.learning_rate))
print('set through the wrapper: inner lr %g' % inner_rate)
history = model.fit(x_train, y_train, batch_size=32, epochs=1, verbose=0,
                    shuffle=False, callbacks=[log_losses])
print('optimizer: %s.%s' % (type(optimizer).__module__,
                            type(optimizer).__name__))
print(json.dumps({'losses': losses, 'weights': [
    float(w) for v in model.trainable_variables
    for w in v.numpy().ravel()[:8]]}))
final_loss = history.history['loss'][-1]
print('initial loss %.5f' % initial_loss)
print('final loss %.5f' % final_loss)
expected = [(0.1, 0.1), (0.05, 0.05), (0.025, 0.025)]
if not np.allclose(log.rates, expected) or abs(inner_rate - 0.01) > 1e-9:
    sys.exit('a learning rate did not reach the inner optimizer: %s' %
             (log.rates,))
if int(optimizer.iterations) != 4 * 16:
    sys.exit('iterations is not the number of steps')
if not final_loss < initial_loss / 4:
    sys.exit('the model did not learn')
