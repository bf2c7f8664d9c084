"""The experimental LossScaleOptimizer with each form of `loss_scale`.

'dynamic', a number, a FixedLossScale and a DynamicLossScale, as in the
TF 2.4 API documentation; each trains the same small regression.
"""
import json

import numpy as np
import tensorflow as tf

rng = np.random.RandomState(0)
x = tf.constant(rng.randn(128, 4), tf.float32)
y = tf.constant(rng.randn(128, 1), tf.float32) + tf.matmul(
    x, tf.constant(rng.randn(4, 1), tf.float32))
losses, weights = [], []


def train(name, opt):
  w = tf.Variable(tf.zeros([4, 1]))
  loss_fn = lambda: tf.reduce_mean(tf.square(tf.matmul(x, w) - y))
  initial_loss = float(loss_fn())
  for _ in range(30):
    losses.append(float(loss_fn()))
    with tf.GradientTape() as tape:
      scaled_loss = opt.get_scaled_loss(loss_fn())
    grads = opt.get_unscaled_gradients(tape.gradient(scaled_loss, [w]))
    opt.apply_gradients(zip(grads, [w]))
  final_loss = float(loss_fn())
  weights.extend(float(v) for v in w.numpy().ravel())
  print('%s: optimizer %s initial loss %.5f final loss %.5f' % (
      name, type(opt).__module__, initial_loss, final_loss))
  if not final_loss < initial_loss / 5:
    raise SystemExit('%s did not learn' % name)


train('dynamic', tf.keras.mixed_precision.experimental.LossScaleOptimizer(
    tf.keras.optimizers.SGD(learning_rate=0.1), loss_scale='dynamic'))
train('number', tf.keras.mixed_precision.experimental.LossScaleOptimizer(
    tf.keras.optimizers.SGD(learning_rate=0.1), loss_scale=123))
train('fixed', tf.keras.mixed_precision.experimental.LossScaleOptimizer(
    tf.keras.optimizers.SGD(learning_rate=0.1),
    loss_scale=tf.train.experimental.FixedLossScale(128.)))
train('dynamic_custom',
      tf.keras.mixed_precision.experimental.LossScaleOptimizer(
          tf.keras.optimizers.SGD(learning_rate=0.1),
          loss_scale=tf.train.experimental.DynamicLossScale(
              initial_loss_scale=2048, increment_period=500)))
print(json.dumps({'losses': losses, 'weights': weights}))
