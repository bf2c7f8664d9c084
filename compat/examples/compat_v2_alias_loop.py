"""A custom loop in a file that imports TensorFlow as `tensorflow.compat.v2`.

As tensorflow/models wrote every file for years (`import
tensorflow.compat.v2 as tf`), with TF 2.4's `LossScaleOptimizer`, the
loss scaled in the tape and the gradients unscaled before they are applied.
"""
import json
import sys

import numpy as np
import tensorflow.compat.v2 as tf


def build_model():
  init = tf.keras.initializers.GlorotUniform
  return tf.keras.Sequential([
      tf.keras.Input(shape=(12,)),
      tf.keras.layers.Dense(24, activation='relu', kernel_initializer=init(3)),
      tf.keras.layers.Dense(1, kernel_initializer=init(4)),
      tf.keras.layers.Activation('linear', dtype='float32'),
  ])


def main():
  tf.keras.mixed_precision.set_global_policy('mixed_float16')
  model = build_model()
  optimizer = tf.keras.mixed_precision.LossScaleOptimizer(
      tf.keras.optimizers.SGD(0.02, momentum=0.9))
  rng = np.random.RandomState(5)
  x = rng.randn(384, 12).astype('float32')
  y = (x[:, :4].sum(axis=1, keepdims=True) / 2).astype('float32')
  dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(48)

  @tf.function
  def train_step(features, targets):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(model(features) - targets))
      scaled_loss = optimizer.get_scaled_loss(loss)
    grads = tape.gradient(scaled_loss, model.trainable_variables)
    grads = optimizer.get_unscaled_gradients(grads)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss

  initial_loss = float(tf.reduce_mean(tf.square(model(x) - y)))
  losses = [float(train_step(a, b)) for _ in range(4) for a, b in dataset]
  final_loss = float(tf.reduce_mean(tf.square(model(x) - y)))
  print('optimizer: %s.%s' % (type(optimizer).__module__,
                              type(optimizer).__name__))
  print(json.dumps({'losses': losses, 'weights': [
      float(w) for v in model.trainable_variables
      for w in v.numpy().ravel()[:8]]}))
  print('initial loss %.5f' % initial_loss)
  print('final loss %.5f' % final_loss)
  if not final_loss < initial_loss / 2:
    sys.exit('the model did not learn')


if __name__ == '__main__':
  main()
