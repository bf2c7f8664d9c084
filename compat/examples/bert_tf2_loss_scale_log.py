"""A TF 2.4-era pretraining loop that logs the loss scale as a number.

In the style of NVIDIA's TF2 BERT: the Keras optimizer goes through
`tf.train.experimental.enable_mixed_precision_graph_rewrite`, the loop
scales the loss and unscales the gradients through the optimizer it got
back, and the log line and the summary use `optimizer.loss_scale` as a
number (`'Loss scale %g'`, a format spec, arithmetic, `tf.summary.scalar`).
"""
import json
import sys

import numpy as np
import tensorflow as tf


def main():
  tf.random.set_seed(4)
  init = tf.keras.initializers.GlorotUniform
  model = tf.keras.Sequential([
      tf.keras.Input(shape=(8,)),
      tf.keras.layers.Dense(16, activation='tanh', kernel_initializer=init(5)),
      tf.keras.layers.Dense(1, kernel_initializer=init(6)),
  ])
  optimizer = tf.keras.optimizers.SGD(0.05)
  optimizer = tf.train.experimental.enable_mixed_precision_graph_rewrite(
      optimizer)
  rng = np.random.RandomState(4)
  x = rng.randn(256, 8).astype('float32')
  y = np.tanh(x[:, :3].sum(axis=1, keepdims=True)).astype('float32')
  dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
  summary_writer = tf.summary.create_noop_writer()

  @tf.function
  def train_step(features, targets):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(model(features) - targets))
      scaled_loss = optimizer.get_scaled_loss(loss)
    grads = tape.gradient(scaled_loss, model.trainable_variables)
    grads = optimizer.get_unscaled_gradients(grads)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss

  losses = []
  for step, (features, targets) in enumerate(dataset.repeat(3)):
    losses.append(float(train_step(features, targets)))
    if step % 8 == 0:
      print('Step %d: loss %.4f, Loss scale %g' % (step, losses[-1],
                                                 optimizer.loss_scale))
      print(f'  log2 of the scale: {np.log2(float(optimizer.loss_scale)):.1f}'
            f', scaled loss {losses[-1] * optimizer.loss_scale:.1f}')
      with summary_writer.as_default():
        tf.summary.scalar('loss_scale', optimizer.loss_scale, step=step)
  tf.config.optimizer.set_experimental_options({'auto_mixed_precision': False})
  print('optimizer: %s.%s' % (type(optimizer).__module__,
                              type(optimizer).__name__))
  print(json.dumps({'losses': losses, 'weights': [
      float(w) for v in model.trainable_variables
      for w in v.numpy().ravel()[:8]]}))
  print('initial loss %.5f' % losses[0])
  print('final loss %.5f' % losses[-1])
  if not losses[-1] < losses[0] / 2:
    sys.exit('the model did not learn')


if __name__ == '__main__':
  main()
