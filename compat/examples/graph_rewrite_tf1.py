"""TF1 training with the mixed precision graph rewrite, NVIDIA/Horovod style.

The optimizer is wrapped by `enable_mixed_precision_graph_rewrite` behind a
flag; gradients are computed, clipped and applied with a global step, in a
Session with its own ConfigProto.
"""
import json
import sys

import numpy as np
import tensorflow.compat.v1 as tf

tf.disable_v2_behavior()
tf.set_random_seed(6)
USE_AMP = True

rng = np.random.RandomState(6)
x_data = rng.randn(256, 4).astype(np.float32)
y_data = (x_data @ rng.randn(4, 1) + 0.5).astype(np.float32)

x = tf.placeholder(tf.float32, [None, 4])
y = tf.placeholder(tf.float32, [None, 1])


def dense(inputs, units, name):
  with tf.variable_scope(name):
    kernel = tf.get_variable(
        'kernel', [inputs.shape[-1], units],
        initializer=tf.glorot_uniform_initializer(seed=6))
    bias = tf.get_variable('bias', [units],
                           initializer=tf.zeros_initializer())
  return tf.matmul(inputs, kernel) + bias


hidden = tf.nn.relu(dense(x, 16, 'hidden'))
predictions = dense(hidden, 1, 'output')
loss = tf.reduce_mean(tf.square(predictions - y))

global_step = tf.train.get_or_create_global_step()
opt = tf.train.MomentumOptimizer(learning_rate=0.02, momentum=0.9)
if USE_AMP:
  opt = tf.train.experimental.enable_mixed_precision_graph_rewrite(
      opt, loss_scale='dynamic')
grads_and_vars = opt.compute_gradients(loss)
grads, variables = zip(*grads_and_vars)
grads, _ = tf.clip_by_global_norm(grads, 5.0)
train_op = opt.apply_gradients(zip(grads, variables), global_step=global_step)

config = tf.ConfigProto()
config.gpu_options.allow_growth = True
with tf.Session(config=config) as sess:
  sess.run(tf.global_variables_initializer())
  feed = {x: x_data, y: y_data}
  initial_loss = sess.run(loss, feed)
  losses = []
  for _ in range(150):
    losses.append(float(sess.run(loss, feed)))
    sess.run(train_op, feed)
  weights = sess.run(tf.trainable_variables())
  final_loss = sess.run(loss, feed)
  print('optimizer: %s.%s' % (type(opt).__module__, type(opt).__name__))
  print('global step %d' % sess.run(global_step))
  print(json.dumps({'losses': losses, 'weights': [
      float(w) for v in weights for w in v.ravel()[:8]]}))
  print('initial loss %.5f' % initial_loss)
  print('final loss %.5f' % final_loss)
if not final_loss < initial_loss / 10:
  sys.exit('the model did not learn')
