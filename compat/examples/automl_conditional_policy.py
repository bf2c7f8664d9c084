"""A detector trainer that picks its precision policy from its config.

In the style of google/automl's EfficientDet Keras trainer: a helper sets
the TF 2.3 policy from a conditional expression on the config, the model
overrides `train_step` and scales the loss only when `compile` gave it a
`LossScaleOptimizer`, and training runs through `fit`.
"""
import json
import sys

import numpy as np
import tensorflow as tf

CONFIG = {'mixed_precision': True, 'learning_rate': 0.05, 'epochs': 3}


def set_precision_policy(config):
  precision = 'mixed_float16' if config['mixed_precision'] else 'float32'
  policy = tf.keras.mixed_precision.experimental.Policy(precision)
  tf.keras.mixed_precision.experimental.set_policy(policy)


class DetNetTrain(tf.keras.Model):
  """A two-layer head trained with a custom train_step."""

  def __init__(self):
    super().__init__()
    init = tf.keras.initializers.GlorotUniform
    self.hidden = tf.keras.layers.Dense(16, activation='relu',
                                        kernel_initializer=init(7))
    self.head = tf.keras.layers.Dense(1, kernel_initializer=init(8))
    self.out = tf.keras.layers.Activation('linear', dtype='float32')

  def call(self, inputs, training=False):
    return self.out(self.head(self.hidden(inputs)))

  def train_step(self, data):
    images, targets = data
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(self(images, training=True) - targets))
      if isinstance(self.optimizer,
                    tf.keras.mixed_precision.experimental.LossScaleOptimizer):
        scaled_loss = self.optimizer.get_scaled_loss(loss)
      else:
        scaled_loss = loss
    grads = tape.gradient(scaled_loss, self.trainable_variables)
    if isinstance(self.optimizer,
                  tf.keras.mixed_precision.experimental.LossScaleOptimizer):
      grads = self.optimizer.get_unscaled_gradients(grads)
    self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
    return {'loss': loss}


class LossHistory(tf.keras.callbacks.Callback):

  def __init__(self):
    super().__init__()
    self.losses = []

  def on_train_batch_end(self, batch, logs=None):
    self.losses.append(float(logs['loss']))


def main():
  tf.random.set_seed(9)
  set_precision_policy(CONFIG)
  model = DetNetTrain()
  model.compile(optimizer=tf.keras.optimizers.SGD(CONFIG['learning_rate']))
  rng = np.random.RandomState(9)
  x = rng.randn(320, 6).astype('float32')
  y = (x[:, :2].sum(axis=1, keepdims=True) / 2).astype('float32')
  history = LossHistory()
  model.fit(x, y, batch_size=32, epochs=CONFIG['epochs'], shuffle=False,
            callbacks=[history], verbose=0)
  print('optimizer: %s.%s' % (type(model.optimizer).__module__,
                              type(model.optimizer).__name__))
  print(json.dumps({'losses': history.losses, 'weights': [
      float(w) for v in model.trainable_variables
      for w in v.numpy().ravel()[:8]]}))
  print('initial loss %.5f' % history.losses[0])
  print('final loss %.5f' % history.losses[-1])
  if not history.losses[-1] < history.losses[0] / 2:
    sys.exit('the model did not learn')


if __name__ == '__main__':
  main()
