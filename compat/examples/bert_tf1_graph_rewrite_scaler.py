"""A TF1 pretraining script that hands its own loss scaler to the rewrite.

In the style of NVIDIA's TF1 BERT `optimization.py`: the optimizer is a
class of the project's own (a `tf.train.Optimizer` subclass), and with fp16
a `DynamicLossScale` built from flags is passed to
`enable_mixed_precision_graph_rewrite(optimizer, loss_scaler)`; training
runs in a Session.
"""
import json
import sys

import numpy as np
import tensorflow.compat.v1 as tf

FLAGS = {'use_fp16': True, 'init_loss_scale': 2 ** 12, 'learning_rate': 0.05,
         'steps': 30}


class WarmupGradientDescentOptimizer(tf.train.GradientDescentOptimizer):
  """Gradient descent whose rate warms up over the first steps."""

  def __init__(self, learning_rate, warmup_steps, name='WarmupGD'):
    step = tf.cast(tf.train.get_or_create_global_step(), tf.float32)
    rate = learning_rate * tf.minimum(1.0, (step + 1.0) / warmup_steps)
    super().__init__(rate, name=name)


def create_optimizer(init_lr, use_fp16):
  optimizer = WarmupGradientDescentOptimizer(init_lr, warmup_steps=5)
  if use_fp16:
    loss_scaler = tf.train.experimental.DynamicLossScale(
        initial_loss_scale=FLAGS['init_loss_scale'], increment_period=1000,
        multiplier=2.0)
    optimizer = tf.train.experimental.enable_mixed_precision_graph_rewrite(
        optimizer, loss_scaler)
  return optimizer


def main():
  tf.disable_v2_behavior()
  rng = np.random.RandomState(3)
  x_data = rng.randn(128, 6).astype('float32')
  y_data = x_data @ rng.randn(6, 1).astype('float32')
  x = tf.placeholder(tf.float32, [None, 6])
  y = tf.placeholder(tf.float32, [None, 1])
  w = tf.get_variable('w', [6, 1], initializer=tf.zeros_initializer())
  loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - y))
  optimizer = create_optimizer(FLAGS['learning_rate'], FLAGS['use_fp16'])
  global_step = tf.train.get_or_create_global_step()
  train_op = optimizer.minimize(loss, global_step=global_step)
  losses = []
  with tf.Session() as sess:
    sess.run(tf.global_variables_initializer())
    for _ in range(FLAGS['steps']):
      value, _ = sess.run([loss, train_op], {x: x_data, y: y_data})
      losses.append(float(value))
    weights = sess.run(w)
  print('optimizer: %s.%s' % (type(optimizer).__module__,
                              type(optimizer).__name__))
  print(json.dumps({'losses': losses,
                    'weights': [float(v) for v in weights.ravel()]}))
  print('initial loss %.5f' % losses[0])
  print('final loss %.5f' % losses[-1])
  if not losses[-1] < losses[0] / 3:
    sys.exit('the model did not learn')


if __name__ == '__main__':
  main()
