"""A TF 2.1-2.3 trainer class that logs the optimizer's loss scale.

In TF 2.1-2.3 `optimizer.loss_scale` of the experimental
`LossScaleOptimizer` was a `LossScale` object: the trainer calls it,
`self.optimizer.loss_scale()`, inside its `tf.function` step to log the
current scale, as trainers of that time did.
"""
import json
import random
import sys

import numpy as np
import tensorflow as tf

ARGS = {'fp16': True, 'learning_rate': 0.05, 'epochs': 6, 'batch_size': 32}


class Trainer:
  """Trains a Keras model with a custom loop; mixed precision optional."""

  def __init__(self, model, args):
    self.model = model
    self.args = args
    self.optimizer = tf.keras.optimizers.SGD(args['learning_rate'],
                                             momentum=0.9)
    if args['fp16']:
      self.optimizer = (
          tf.keras.mixed_precision.experimental.LossScaleOptimizer(
              self.optimizer, 'dynamic'))
    self.loss_fn = tf.keras.losses.MeanSquaredError()
    self.losses = []

  @tf.function
  def _train_step(self, features, labels):
    with tf.GradientTape() as tape:
      loss = self.loss_fn(labels, self.model(features, training=True))
      if self.args['fp16']:
        loss_to_differentiate = self.optimizer.get_scaled_loss(loss)
      else:
        loss_to_differentiate = loss
    variables = self.model.trainable_variables
    gradients = tape.gradient(loss_to_differentiate, variables)
    if self.args['fp16']:
      gradients = self.optimizer.get_unscaled_gradients(gradients)
    self.optimizer.apply_gradients(zip(gradients, variables))
    return loss, self.optimizer.loss_scale()

  def train(self, dataset):
    for epoch in range(self.args['epochs']):
      for features, labels in dataset:
        loss, loss_scale = self._train_step(features, labels)
        self.losses.append(float(loss))
      print('epoch %d: loss %.4f, loss scale %g' % (epoch, float(loss),
                                                    float(loss_scale)))


def main():
  random.seed(7)
  np.random.seed(7)
  tf.random.set_seed(7)
  if ARGS['fp16']:
    policy = tf.keras.mixed_precision.experimental.Policy('mixed_float16')
    tf.keras.mixed_precision.experimental.set_policy(policy)
  model = tf.keras.Sequential([
      tf.keras.layers.Dense(16, activation='relu', input_shape=(4,)),
      tf.keras.layers.Dense(1, dtype='float32'),
  ])
  rng = np.random.RandomState(7)
  x = rng.randn(256, 4).astype('float32')
  y = (x ** 2).sum(axis=1, keepdims=True) / 4
  dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(
      ARGS['batch_size'])
  trainer = Trainer(model, ARGS)
  initial_loss = float(trainer.loss_fn(y, model(x)))
  trainer.train(dataset)
  final_loss = float(trainer.loss_fn(y, model(x)))
  print('optimizer: %s.%s' % (type(trainer.optimizer).__module__,
                              type(trainer.optimizer).__name__))
  print(json.dumps({'losses': trainer.losses, 'weights': [
      float(w) for v in model.trainable_variables
      for w in v.numpy().ravel()[:8]]}))
  print('initial loss %.5f' % initial_loss)
  print('final loss %.5f' % final_loss)
  if not final_loss < initial_loss / 3:
    sys.exit('the model did not learn')


if __name__ == '__main__':
  main()
