"""Using tf.train.experimental.DynamicLossScale directly, without Keras.

The loss is computed in float16; the first steps overflow at the initial
scale of 2**15, are skipped, and the scale halves until it fits.
"""
import json

import numpy as np
import tensorflow as tf

loss_scale = tf.train.experimental.DynamicLossScale(
    initial_loss_scale=2**15, increment_period=20, multiplier=2.)

rng = np.random.RandomState(0)
x_data = rng.randn(256, 4)
x = tf.constant(x_data, tf.float16)
y = tf.constant(x_data @ rng.randn(4, 1) * 3.0, tf.float16)
w = tf.Variable(tf.zeros([4, 1]))


def loss_fn():
  predictions = tf.matmul(x, tf.cast(w, tf.float16))
  return tf.reduce_mean(tf.square(predictions - y))


initial_loss = float(loss_fn())
skipped = 0
losses = []
for step in range(40):
  losses.append(float(loss_fn()))
  with tf.GradientTape() as tape:
    scaled_loss = loss_fn() * tf.cast(loss_scale(), tf.float16)
  scaled_grads = tape.gradient(scaled_loss, [w])
  grads = [g / loss_scale() for g in scaled_grads]
  _, should_apply_gradients = loss_scale.update(grads)
  if should_apply_gradients:
    w.assign_sub(0.1 * grads[0])
  else:
    skipped += 1
print('loss scale: %s.%s' % (type(loss_scale).__module__,
                             type(loss_scale).__name__))
print('skipped steps %d' % skipped)
print(json.dumps({'losses': losses,
                  'weights': [float(v) for v in w.numpy().ravel()]}))
print('final loss scale %g' % float(loss_scale()))
print('initial loss %.5f' % initial_loss)
final_loss = float(loss_fn())
print('final loss %.5f' % final_loss)
if skipped < 1 or not final_loss < initial_loss / 5:
  raise SystemExit('no step was skipped, or the model did not learn')
