"""A subclassed model's `train_step` calling `optimizer.minimize(..., tape=)`.

TF 2.4-2.10's own `Model.train_step` ended in
`self.optimizer.minimize(loss, self.trainable_variables, tape=tape)`, and
models that override `train_step` copied it. Under the 'mixed_float16'
policy `compile` wraps the optimizer in a `LossScaleOptimizer`, whose
`minimize` scales the loss recorded on the tape and unscales the gradients.
"""
import json
import random
import sys

import numpy as np
import tensorflow as tf
from tensorflow.keras import mixed_precision


class Regressor(tf.keras.Model):

    def __init__(self):
        super().__init__()
        self.hidden = tf.keras.layers.Dense(32, activation='relu')
        self.out = tf.keras.layers.Dense(1, dtype='float32')
        self.loss_tracker = tf.keras.metrics.Mean(name='loss')

    def call(self, inputs, training=False):
        return self.out(self.hidden(inputs))

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = tf.reduce_mean(tf.square(y_pred - y))
        self.optimizer.minimize(loss, self.trainable_variables, tape=tape)
        self.loss_tracker.update_state(loss)
        return {'loss': self.loss_tracker.result()}

    @property
    def metrics(self):
        return [self.loss_tracker]


random.seed(11)
np.random.seed(11)
tf.random.set_seed(11)
mixed_precision.set_global_policy('mixed_float16')

rng = np.random.RandomState(11)
x_train = rng.randn(512, 6).astype('float32')
y_train = (x_train[:, :3].sum(axis=1, keepdims=True)
           - x_train[:, 3:4]).astype('float32')

model = Regressor()
model.compile(optimizer=tf.keras.optimizers.SGD(learning_rate=0.05))
model(x_train[:1])
initial_loss = float(np.mean(np.square(model(x_train).numpy() - y_train)))
losses = []
log_losses = tf.keras.callbacks.LambdaCallback(
    on_train_batch_end=lambda batch, logs: losses.append(
        float(logs['loss'])))
model.fit(x_train, y_train, batch_size=32, epochs=5, verbose=0,
          shuffle=False, callbacks=[log_losses])
optimizer = model.optimizer
if not isinstance(optimizer, mixed_precision.LossScaleOptimizer):
    sys.exit('compile did not wrap the optimizer')
print('optimizer: %s.%s' % (type(optimizer).__module__,
                            type(optimizer).__name__))
print(json.dumps({'losses': losses, 'weights': [
    float(w) for v in model.trainable_variables
    for w in v.numpy().ravel()[:8]]}))
print('iterations %d, loss scale %g' % (int(optimizer.iterations),
                                        float(optimizer.loss_scale)))
final_loss = float(np.mean(np.square(model(x_train).numpy() - y_train)))
print('initial loss %.5f' % initial_loss)
print('final loss %.5f' % final_loss)
if int(optimizer.iterations) != 5 * 16:
    sys.exit('minimize did not count one step per batch')
if not final_loss < initial_loss / 5:
    sys.exit('the model did not learn')
