"""A TF 2.2-era token-classification trainer that never scales the loss.

In the style of trainers of that time (transformers' `run_tf_ner.py` and its
TFTrainer): with `fp16` the optimizer is wrapped in the experimental
`LossScaleOptimizer(opt, 'dynamic')`, and the loop then applies gradients it
never scaled (TensorFlow's auto mixed precision graph rewrite did the
float16 work then), clipped by global norm. TF 2.1-2.4's class applied such
gradients as given.
"""
import json
import sys

import numpy as np
import tensorflow as tf

ARGS = {'fp16': True, 'learning_rate': 0.05, 'max_grad_norm': 1.0,
        'epochs': 4, 'batch_size': 32, 'num_labels': 3}


def create_optimizer(learning_rate):
  return tf.keras.optimizers.SGD(learning_rate, momentum=0.9)


class TokenClassifierTrainer:
  """Trains a token classifier; the loss is a mean over tokens."""

  def __init__(self, model, args):
    self.model = model
    self.args = args
    self.optimizer = create_optimizer(args['learning_rate'])
    if args['fp16']:
      self.optimizer = tf.keras.mixed_precision.experimental.LossScaleOptimizer(
          self.optimizer, 'dynamic')

  def compute_loss(self, labels, logits):
    return tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
        labels, logits, from_logits=True))

  @tf.function
  def train_step(self, features, labels):
    with tf.GradientTape() as tape:
      loss = self.compute_loss(labels, self.model(features, training=True))
    gradients = tape.gradient(loss, self.model.trainable_variables)
    gradients, _ = tf.clip_by_global_norm(gradients,
                                          self.args['max_grad_norm'])
    self.optimizer.apply_gradients(zip(gradients,
                                       self.model.trainable_variables))
    return loss

  def train(self, dataset):
    losses = []
    for _ in range(self.args['epochs']):
      for features, labels in dataset:
        losses.append(float(self.train_step(features, labels)))
    return losses


def main():
  tf.random.set_seed(11)
  rng = np.random.RandomState(11)
  tokens = rng.randn(256, 6, 8).astype('float32')
  labels = (tokens[..., 0] > 0).astype('int64') + (tokens[..., 1] > 1)
  model = tf.keras.Sequential([
      tf.keras.Input(shape=(6, 8)),
      tf.keras.layers.Dense(16, activation='relu',
                            kernel_initializer=tf.keras.initializers.
                            GlorotUniform(seed=1)),
      tf.keras.layers.Dense(ARGS['num_labels'],
                            kernel_initializer=tf.keras.initializers.
                            GlorotUniform(seed=2)),
  ])
  dataset = tf.data.Dataset.from_tensor_slices((tokens, labels)).batch(
      ARGS['batch_size'])
  trainer = TokenClassifierTrainer(model, ARGS)
  initial_loss = float(trainer.compute_loss(labels, model(tokens)))
  losses = trainer.train(dataset)
  final_loss = float(trainer.compute_loss(labels, model(tokens)))
  print('optimizer: %s.%s' % (type(trainer.optimizer).__module__,
                              type(trainer.optimizer).__name__))
  print(json.dumps({'losses': losses, 'weights': [
      float(w) for v in model.trainable_variables
      for w in v.numpy().ravel()[:8]]}))
  print('initial loss %.5f' % initial_loss)
  print('final loss %.5f' % final_loss)
  if not final_loss < initial_loss * 0.8:
    sys.exit('the model did not learn')


if __name__ == '__main__':
  main()
