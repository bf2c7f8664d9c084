"""A model whose `compile` wraps the optimizer itself (TensorFlowASR style).

`from tensorflow.keras import mixed_precision as mxp`; the model's
`compile` override wraps `tf.keras.optimizers.get(optimizer)` in
`mxp.experimental.LossScaleOptimizer(..., "dynamic")` and remembers to
scale; its `train_step` scales the loss and unscales the gradients when it
does. Trained with `fit` under the 'mixed_float16' policy.
"""
import json
import random
import sys

import numpy as np
import tensorflow as tf
from tensorflow.keras import mixed_precision as mxp


class BaseModel(tf.keras.Model):

    def compile(self, loss, optimizer, run_eagerly=None, **kwargs):
        self.use_loss_scale = True
        optimizer = mxp.experimental.LossScaleOptimizer(
            tf.keras.optimizers.get(optimizer), 'dynamic')
        self.loss_metric = tf.keras.metrics.Mean(name='loss')
        super().compile(optimizer=optimizer, loss=loss,
                        run_eagerly=run_eagerly, **kwargs)

    @property
    def metrics(self):
        return [self.loss_metric]

    def train_step(self, batch):
        inputs, labels = batch
        with tf.GradientTape() as tape:
            outputs = self(inputs, training=True)
            loss = tf.reduce_mean(self.loss(labels, outputs))
            if self.use_loss_scale:
                scaled_loss = self.optimizer.get_scaled_loss(loss)
        if self.use_loss_scale:
            gradients = tape.gradient(scaled_loss, self.trainable_weights)
            gradients = self.optimizer.get_unscaled_gradients(gradients)
        else:
            gradients = tape.gradient(loss, self.trainable_weights)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_weights))
        self.loss_metric.update_state(loss)
        return {'loss': self.loss_metric.result()}


class Classifier(BaseModel):

    def __init__(self):
        super().__init__()
        self.hidden = tf.keras.layers.Dense(32, activation='relu')
        self.logits = tf.keras.layers.Dense(3, dtype='float32')

    def call(self, inputs, training=False):
        return self.logits(self.hidden(inputs))


random.seed(18)
np.random.seed(18)
tf.random.set_seed(18)
mxp.set_global_policy('mixed_float16')
rng = np.random.RandomState(18)
x_train = rng.randn(512, 7).astype('float32')
y_train = np.argmax(x_train[:, :3], axis=1)

model = Classifier()
model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(
    from_logits=True, reduction='none'),
    optimizer=tf.keras.optimizers.Adam(learning_rate=1e-2))
model(x_train[:1])
xent = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
initial_loss = float(xent(y_train, model(x_train)))
losses = []
log_losses = tf.keras.callbacks.LambdaCallback(
    on_train_batch_end=lambda batch, logs: losses.append(
        float(logs['loss'])))
model.fit(x_train, y_train, batch_size=32, epochs=5, verbose=0, shuffle=False,
          callbacks=[log_losses])
optimizer = model.optimizer
print('optimizer: %s.%s' % (type(optimizer).__module__,
                            type(optimizer).__name__))
print(json.dumps({'losses': losses, 'weights': [
    float(w) for v in model.trainable_variables
    for w in v.numpy().ravel()[:8]]}))
final_loss = float(xent(y_train, model(x_train)))
print('initial loss %.5f' % initial_loss)
print('final loss %.5f' % final_loss)
if not isinstance(optimizer, mxp.LossScaleOptimizer):
    sys.exit('the optimizer is not a LossScaleOptimizer')
if not final_loss < initial_loss / 3:
    sys.exit('the model did not learn')
