"""A TF1 graph trained in a Session with MixedPrecisionLossScaleOptimizer.

The forward pass runs in float16; the optimizer scales the loss, unscales
the gradients and skips the steps whose gradients overflow.
"""
import json

import numpy as np
import tensorflow.compat.v1 as tf

tf.disable_eager_execution()
tf.set_random_seed(0)

rng = np.random.RandomState(0)
x_data = rng.randn(256, 4).astype(np.float32)
y_data = (x_data @ rng.randn(4, 1) * 3.0).astype(np.float32)

x = tf.placeholder(tf.float32, [None, 4])
y = tf.placeholder(tf.float32, [None, 1])
w = tf.get_variable('w', [4, 1], initializer=tf.zeros_initializer())
predictions = tf.matmul(tf.cast(x, tf.float16), tf.cast(w, tf.float16))
loss = tf.reduce_mean(tf.square(tf.cast(predictions, tf.float32) - y))

opt = tf.train.GradientDescentOptimizer(0.1)
opt = tf.train.experimental.MixedPrecisionLossScaleOptimizer(
    opt, loss_scale=tf.train.experimental.DynamicLossScale(
        initial_loss_scale=2**15, increment_period=50))
train_op = opt.minimize(loss)

with tf.Session() as sess:
  sess.run(tf.global_variables_initializer())
  feed = {x: x_data, y: y_data}
  initial_loss = sess.run(loss, feed)
  losses = []
  for _ in range(60):
    losses.append(float(sess.run(loss, feed)))
    sess.run(train_op, feed)
  weights = sess.run(tf.trainable_variables())
  print('optimizer: %s.%s' % (type(opt).__module__, type(opt).__name__))
  print(json.dumps({'losses': losses, 'weights': [
      float(w) for v in weights for w in v.ravel()[:8]]}))
  print('initial loss %.5f' % initial_loss)
  final_loss = sess.run(loss, feed)
  print('final loss %.5f' % final_loss)
if not final_loss < initial_loss / 5:
  raise SystemExit('the model did not learn')
