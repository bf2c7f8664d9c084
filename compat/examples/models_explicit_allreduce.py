"""Explicit all-reduce of scaled float16 gradients under MirroredStrategy.

In the style of tensorflow/models' `minimize_using_explicit_allreduce`: the
replicas all-reduce the *scaled* gradients themselves, then unscale them
and call `apply_gradients(..., experimental_aggregate_gradients=False)` so
that the optimizer does not sum them a second time. Two logical CPUs stand
in for two GPUs. The first step is checked against the plain gradient of
the global batch: a second sum would double it.
"""
import json
import random
import sys

import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices('CPU')[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
random.seed(4)
np.random.seed(4)
tf.random.set_seed(4)

GLOBAL_BATCH = 64
LEARNING_RATE = 0.1


def _filter_and_allreduce_gradients(grads_and_vars):
    """Drops None gradients and sums the rest over the replicas."""
    filtered = [(g, v) for g, v in grads_and_vars if g is not None]
    grads, variables = zip(*filtered)
    allreduced = tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM, list(grads))
    return allreduced, variables


def minimize_using_explicit_allreduce(tape, optimizer, loss,
                                      trainable_variables):
    if isinstance(optimizer, tf.keras.mixed_precision.LossScaleOptimizer):
        with tape:
            scaled_loss = optimizer.get_scaled_loss(loss)
        scaled_grads = tape.gradient(scaled_loss, trainable_variables)
        allreduced_scaled_grads, variables = _filter_and_allreduce_gradients(
            zip(scaled_grads, trainable_variables))
        grads = optimizer.get_unscaled_gradients(allreduced_scaled_grads)
    else:
        grads = tape.gradient(loss, trainable_variables)
        grads, variables = _filter_and_allreduce_gradients(
            zip(grads, trainable_variables))
    optimizer.apply_gradients(zip(grads, variables),
                              experimental_aggregate_gradients=False)


strategy = tf.distribute.MirroredStrategy(['/cpu:0', '/cpu:1'])
with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.Input(shape=(5,)),
        tf.keras.layers.Dense(1, use_bias=False),
    ])
    optimizer = tf.keras.mixed_precision.LossScaleOptimizer(
        tf.keras.optimizers.SGD(LEARNING_RATE))

rng = np.random.RandomState(4)
x_train = rng.randn(512, 5).astype('float32')
y_train = x_train @ np.array([[1.], [-2.], [.5], [3.], [0.]], 'float32')
dataset = strategy.experimental_distribute_dataset(
    tf.data.Dataset.from_tensor_slices((x_train, y_train)).batch(
        GLOBAL_BATCH))


@tf.function
def train_step(inputs):
    def step_fn(features, labels):
        with tf.GradientTape() as tape:
            predictions = model(features, training=True)
            loss = tf.reduce_sum(tf.square(predictions - labels)) / GLOBAL_BATCH
        minimize_using_explicit_allreduce(tape, optimizer, loss,
                                          model.trainable_variables)
        return loss
    losses = strategy.run(step_fn, args=inputs)
    return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)


def full_loss():
    return float(np.mean(np.square(model(x_train).numpy() - y_train)))


kernel = model.trainable_variables[0].numpy()
first_x, first_y = x_train[:GLOBAL_BATCH], y_train[:GLOBAL_BATCH]
gradient = 2 * first_x.T @ (first_x @ kernel - first_y) / GLOBAL_BATCH
initial_loss = full_loss()
losses = []
for epoch in range(6):
    for step, inputs in enumerate(dataset):
        losses.append(float(train_step(inputs)))
        if epoch == 0 and step == 0:
            applied = kernel - model.trainable_variables[0].numpy()
            ratio = float(np.sum(applied * gradient)
                          / np.sum(gradient * gradient)) / LEARNING_RATE
            print('first step applied %.3f times the gradient' % ratio)
            if abs(ratio - 1) > 1e-3:
                sys.exit('the all-reduced gradients were summed again')
print('optimizer: %s.%s' % (type(optimizer).__module__,
                            type(optimizer).__name__))
print(json.dumps({'losses': losses, 'weights': [
    float(w) for v in model.trainable_variables
    for w in v.numpy().ravel()[:8]]}))
final_loss = full_loss()
print('initial loss %.5f' % initial_loss)
print('final loss %.5f' % final_loss)
if not final_loss < initial_loss / 10:
    sys.exit('the model did not learn')
