"""A fixed loss scale chosen by a flag, in the style of model garden code.

A `configure_optimizer` helper wraps the optimizer in
`tf.keras.mixed_precision.LossScaleOptimizer` (dynamic, or fixed with
`dynamic=False, initial_scale=...`), and the training step checks with
`isinstance` whether to scale. The second model trains with `minimize`.
"""
import json
import random
import sys

import numpy as np
import tensorflow as tf

FLAGS = {'dtype': 'float16', 'loss_scale': 128, 'learning_rate': 0.05}


def configure_optimizer(optimizer, use_float16=False, loss_scale=None):
    """Wraps the optimizer for float16 training, as the flags say."""
    if use_float16:
        if loss_scale in (None, 'dynamic'):
            optimizer = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)
        else:
            optimizer = tf.keras.mixed_precision.LossScaleOptimizer(
                optimizer, dynamic=False, initial_scale=loss_scale)
    return optimizer


def build_model():
    return tf.keras.Sequential([
        tf.keras.Input(shape=(6,)),
        tf.keras.layers.Dense(24, activation='tanh'),
        tf.keras.layers.Dense(1, dtype='float32'),
    ])


def main():
    random.seed(3)
    np.random.seed(3)
    tf.random.set_seed(3)
    use_float16 = FLAGS['dtype'] == 'float16'
    if use_float16:
        tf.keras.mixed_precision.set_global_policy('mixed_float16')
    rng = np.random.RandomState(3)
    x = rng.randn(512, 6).astype('float32')
    y = np.sin(x[:, :1]) + 0.5 * x[:, 1:2]
    mse = tf.keras.losses.MeanSquaredError()

    model = build_model()
    optimizer = configure_optimizer(
        tf.keras.optimizers.SGD(FLAGS['learning_rate'], momentum=0.9),
        use_float16=use_float16, loss_scale=FLAGS['loss_scale'])

    @tf.function
    def train_step(features, labels):
        with tf.GradientTape() as tape:
            loss = mse(labels, model(features, training=True))
            if isinstance(optimizer,
                          tf.keras.mixed_precision.LossScaleOptimizer):
                scaled_loss = optimizer.get_scaled_loss(loss)
            else:
                scaled_loss = loss
        grads = tape.gradient(scaled_loss, model.trainable_variables)
        if isinstance(optimizer, tf.keras.mixed_precision.LossScaleOptimizer):
            grads = optimizer.get_unscaled_gradients(grads)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    other = build_model()
    other_optimizer = configure_optimizer(
        tf.keras.optimizers.SGD(FLAGS['learning_rate']),
        use_float16=use_float16, loss_scale='dynamic')

    def other_loss():
        return mse(y, other(x, training=True))

    results, losses = [], []
    for name, net in (('train_step', model), ('minimize', other)):
        initial = float(mse(y, net(x)))
        for epoch in range(40):
            if net is model:
                for start in range(0, 512, 128):
                    losses.append(float(train_step(x[start:start + 128],
                                                   y[start:start + 128])))
            else:
                losses.append(float(other_loss()))
                other_optimizer.minimize(other_loss, other.trainable_variables)
        final = float(mse(y, net(x)))
        print('%s: initial loss %.5f final loss %.5f' % (name, initial, final))
        results.append(final < initial / 4)
    print('optimizer: %s.%s dynamic=%s loss scale %g' % (
        type(optimizer).__module__, type(optimizer).__name__,
        optimizer.dynamic, float(optimizer.loss_scale)))
    print(json.dumps({'losses': losses, 'weights': [
        float(w) for net in (model, other) for v in net.trainable_variables
        for w in v.numpy().ravel()[:8]]}))
    if not all(results):
        sys.exit('a model did not learn')


if __name__ == '__main__':
    main()
