"""Gradient accumulation with the experimental LossScaleOptimizer.

In the style of TF 2.1-2.3 trainers (OpenNMT-tf's, AWS' ALBERT
pretraining): the optimizer is wrapped when TensorFlow's
`auto_mixed_precision` option is on and it is not already a
LossScaleOptimizer; one `tf.function` scales the loss of a micro-batch,
unscales its gradients and adds them to accumulators; another, run every
few micro-batches, clips the accumulated gradients and applies them. The
first apply is checked against the plain gradient of the accumulated
micro-batches.
"""
import json
import random
import sys

import numpy as np
import tensorflow as tf

ACCUM_STEPS = 4
LEARNING_RATE = 0.05

random.seed(12)
np.random.seed(12)
tf.random.set_seed(12)
tf.config.optimizer.set_experimental_options({'auto_mixed_precision': True})

model = tf.keras.Sequential([
    tf.keras.Input(shape=(6,)),
    tf.keras.layers.Dense(1, use_bias=False),
])
optimizer = tf.keras.optimizers.SGD(LEARNING_RATE)
options = tf.config.optimizer.get_experimental_options()
if (options.get('auto_mixed_precision') and not isinstance(
        optimizer, tf.keras.mixed_precision.experimental.LossScaleOptimizer)):
    optimizer = tf.keras.mixed_precision.experimental.LossScaleOptimizer(
        optimizer, 'dynamic')
accumulators = [tf.Variable(tf.zeros_like(v), trainable=False)
                for v in model.trainable_variables]
accumulated = tf.Variable(0, trainable=False)


@tf.function
def accumulate(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        scaled_loss = optimizer.get_scaled_loss(loss)
    scaled_gradients = tape.gradient(scaled_loss, model.trainable_variables)
    gradients = optimizer.get_unscaled_gradients(scaled_gradients)
    for accumulator, gradient in zip(accumulators, gradients):
        accumulator.assign_add(gradient)
    accumulated.assign_add(1)
    return loss


@tf.function
def apply_accumulated():
    count = tf.cast(accumulated, tf.float32)
    gradients = [a / count for a in accumulators]
    gradients, _ = tf.clip_by_global_norm(gradients, 100.0)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    for accumulator in accumulators:
        accumulator.assign(tf.zeros_like(accumulator))
    accumulated.assign(0)


rng = np.random.RandomState(12)
x_train = rng.randn(512, 6).astype('float32')
y_train = x_train @ np.array([[1.], [-1.], [2.], [0.], [.5], [-3.]], 'float32')
dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train)).batch(32)


def full_loss():
    return float(np.mean(np.square(model(x_train).numpy() - y_train)))


initial_loss = full_loss()
losses = []
for epoch in range(6):
    for step, (x, y) in enumerate(dataset):
        if epoch == 0 and step == 0:
            kernel = model.trainable_variables[0].numpy()
        losses.append(float(accumulate(x, y)))
        if (step + 1) % ACCUM_STEPS == 0:
            if epoch == 0 and step + 1 == ACCUM_STEPS:
                first = x_train[:32 * ACCUM_STEPS]
                target = y_train[:32 * ACCUM_STEPS]
                gradient = 2 * first.T @ (first @ kernel - target) / len(first)
            apply_accumulated()
            if epoch == 0 and step + 1 == ACCUM_STEPS:
                applied = kernel - model.trainable_variables[0].numpy()
                ratio = float(np.sum(applied * gradient) / np.sum(
                    gradient * gradient)) / LEARNING_RATE
                print('first apply moved %.3f times the gradient' % ratio)
                if abs(ratio - 1) > 1e-2:
                    sys.exit('the accumulated gradients were not applied '
                             'as they were unscaled')
print('optimizer: %s.%s' % (type(optimizer).__module__,
                            type(optimizer).__name__))
print('iterations %d' % int(optimizer.iterations))
print(json.dumps({'losses': losses, 'weights': [
    float(w) for v in model.trainable_variables
    for w in v.numpy().ravel()[:8]]}))
final_loss = full_loss()
print('initial loss %.5f' % initial_loss)
print('final loss %.5f' % final_loss)
if int(optimizer.iterations) != 6 * 16 // ACCUM_STEPS:
    sys.exit('the optimizer did not count one step per apply')
if not final_loss < initial_loss / 10:
    sys.exit('the model did not learn')
