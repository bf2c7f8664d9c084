"""A float32 Keras model compiled with an explicitly wrapped optimizer.

In the style of Hugging Face's TF 2.0-2.3 GLUE example: a flag turns on
TensorFlow's `auto_mixed_precision` graph option and wraps Adam in the
experimental `LossScaleOptimizer` with a positional 'dynamic' loss scale;
the model is compiled with a metric and trained with `fit` and validation
data. No dtype policy is set.
"""
import json
import random
import sys

import numpy as np
import tensorflow as tf

USE_AMP = True
BATCH_SIZE = 32

random.seed(9)
np.random.seed(9)
tf.random.set_seed(9)
tf.config.optimizer.set_experimental_options({'auto_mixed_precision': USE_AMP})

rng = np.random.RandomState(9)
features = rng.randn(640, 10).astype('float32')
labels = (features[:, 0] + features[:, 1] > 0).astype('int64')
train = tf.data.Dataset.from_tensor_slices(
    (features[:512], labels[:512])).shuffle(128, seed=9).batch(BATCH_SIZE)
valid = tf.data.Dataset.from_tensor_slices(
    (features[512:], labels[512:])).batch(BATCH_SIZE * 2)

model = tf.keras.Sequential([
    tf.keras.Input(shape=(10,)),
    tf.keras.layers.Dense(16, activation='relu'),
    tf.keras.layers.Dense(2),
])
opt = tf.keras.optimizers.Adam(learning_rate=1e-2, epsilon=1e-08)
if USE_AMP:
    # loss scaling is needed when the graph runs in float16
    opt = tf.keras.mixed_precision.experimental.LossScaleOptimizer(
        opt, 'dynamic')
loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
metric = tf.keras.metrics.SparseCategoricalAccuracy('accuracy')
model.compile(optimizer=opt, loss=loss, metrics=[metric])

initial_loss = model.evaluate(valid, verbose=0)[0]
losses = []
log_losses = tf.keras.callbacks.LambdaCallback(
    on_train_batch_end=lambda batch, logs: losses.append(
        float(logs['loss'])))
history = model.fit(train, epochs=5, validation_data=valid, verbose=0,
                    callbacks=[log_losses])
print('optimizer: %s.%s' % (type(model.optimizer).__module__,
                            type(model.optimizer).__name__))
print(json.dumps({'losses': losses, 'weights': [
    float(w) for v in model.trainable_variables
    for w in v.numpy().ravel()[:8]]}))
final_loss = history.history['val_loss'][-1]
accuracy = history.history['val_accuracy'][-1]
print('validation accuracy %.3f' % accuracy)
print('initial loss %.5f' % initial_loss)
print('final loss %.5f' % final_loss)
if model.optimizer is not opt:
    sys.exit('compile replaced the wrapped optimizer')
if not (final_loss < initial_loss / 2 and accuracy > 0.85):
    sys.exit('the model did not learn')
