"""A fixed loss scale from a flag, in the style of tensorflow/models' TF 2.3
ResNet custom training loop.

The policy is set with the flag's loss scale, `global_step` is taken from
the optimizer's `iterations` before the optimizer is wrapped in the
experimental `LossScaleOptimizer(optimizer, loss_scale)`, and the step
scales only when `isinstance` says the optimizer is a loss-scale one.
"""
import json
import random
import sys

import numpy as np
import tensorflow as tf

FLAGS = {'dtype': 'fp16', 'loss_scale': 128, 'train_epochs': 5}


class ResnetRunnable:

    def __init__(self, flags):
        self.dtype = tf.float16 if flags['dtype'] == 'fp16' else tf.float32
        if self.dtype == tf.float16:
            policy = tf.keras.mixed_precision.experimental.Policy(
                'mixed_float16', loss_scale=flags['loss_scale'])
            tf.keras.mixed_precision.experimental.set_policy(policy)
        self.model = tf.keras.Sequential([
            tf.keras.Input(shape=(8,)),
            tf.keras.layers.Dense(32, activation='relu'),
            tf.keras.layers.Dense(4),
            tf.keras.layers.Activation('softmax', dtype='float32'),
        ])
        self.optimizer = tf.keras.optimizers.SGD(0.1, momentum=0.9)
        self.global_step = self.optimizer.iterations
        if self.dtype == tf.float16:
            self.optimizer = (
                tf.keras.mixed_precision.experimental.LossScaleOptimizer(
                    self.optimizer, flags['loss_scale']))
        self.loss_object = tf.keras.losses.SparseCategoricalCrossentropy()

    @tf.function
    def train_step(self, images, labels):
        with tf.GradientTape() as tape:
            logits = self.model(images, training=True)
            loss = self.loss_object(labels, logits)
            if isinstance(self.optimizer,
                          tf.keras.mixed_precision.experimental.
                          LossScaleOptimizer):
                scaled_loss = self.optimizer.get_scaled_loss(loss)
            else:
                scaled_loss = loss
        grads = tape.gradient(scaled_loss, self.model.trainable_variables)
        if isinstance(self.optimizer,
                      tf.keras.mixed_precision.experimental.LossScaleOptimizer):
            grads = self.optimizer.get_unscaled_gradients(grads)
        self.optimizer.apply_gradients(
            zip(grads, self.model.trainable_variables))
        return loss


def main():
    random.seed(17)
    np.random.seed(17)
    tf.random.set_seed(17)
    runnable = ResnetRunnable(FLAGS)
    rng = np.random.RandomState(17)
    x = rng.randn(512, 8).astype('float32')
    y = np.argmax(x[:, :4], axis=1)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(64)
    initial_loss = float(runnable.loss_object(y, runnable.model(x)))
    losses = []
    for _ in range(FLAGS['train_epochs']):
        for images, labels in dataset:
            losses.append(float(runnable.train_step(images, labels)))
    optimizer = runnable.optimizer
    print('optimizer: %s.%s, global step %d' % (
        type(optimizer).__module__, type(optimizer).__name__,
        int(runnable.global_step)))
    print(json.dumps({'losses': losses, 'weights': [
        float(w) for v in runnable.model.trainable_variables
        for w in v.numpy().ravel()[:8]]}))
    final_loss = float(runnable.loss_object(y, runnable.model(x)))
    print('initial loss %.5f' % initial_loss)
    print('final loss %.5f' % final_loss)
    if int(runnable.global_step) != FLAGS['train_epochs'] * 8:
        sys.exit('global_step did not count the steps')
    if optimizer.dynamic or float(optimizer.loss_scale()) != 128:
        sys.exit('the loss scale is not the fixed one of the flag')
    if not final_loss < initial_loss / 3:
        sys.exit('the model did not learn')


if __name__ == '__main__':
    main()
