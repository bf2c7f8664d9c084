"""Saving the Keras 3 LossScaleOptimizer: `.keras` files and checkpoints."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_lossscale
from tf_lossscale.keras_optimizer import KerasLossScaleOptimizer


def _trained_model():
    """A mixed_float16 model fitted 5 steps; the scale moved off its start."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = keras.Sequential([
            keras.Input((3,)),
            keras.layers.Dense(4, kernel_initializer=keras.initializers.
                               GlorotUniform(seed=4)),
            keras.layers.Dense(1, dtype="float32", kernel_initializer="ones"),
        ])
        opt = tf_lossscale.LossScaleOptimizer(
            keras.optimizers.SGD(0.01, momentum=0.5), initial_scale=2.0**30,
            dynamic_growth_steps=3)
        model.compile(optimizer=opt, loss="mse")
        x = np.random.default_rng(1).normal(size=(40, 3)).astype("float32")
        model.fit(x, x.sum(axis=1), batch_size=8, epochs=1, verbose=0)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return model, opt


def test_keras_file_round_trip_restores_config_scale_counter_and_slots(
        tmp_path):
    model, opt = _trained_model()
    assert float(opt.loss_scale) < 2.0**30  # Something to restore.
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    restored = loaded.optimizer
    assert type(restored) is KerasLossScaleOptimizer
    assert restored.get_config() == opt.get_config()
    assert float(restored.loss_scale) == float(opt.loss_scale)
    assert int(restored.dynamic_counter) == int(opt.dynamic_counter)
    assert int(restored.iterations) == 5
    assert len(restored.variables) == len(opt.variables) == 10
    for mine, theirs in zip(restored.variables, opt.variables):
        np.testing.assert_array_equal(mine, theirs)


def test_checkpoint_round_trip_of_scale_counter_and_momentum(tmp_path):
    var = keras.Variable([1.0, 2.0])
    opt = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(0.1, momentum=0.9), initial_scale=16,
        dynamic_growth_steps=5)
    for grad in ([16.0, 16.0], [np.nan, 1.0], [8.0, 8.0], [8.0, 8.0]):
        opt.apply_gradients([(tf.constant(grad), var)])
    saved = (float(opt.loss_scale), int(opt.dynamic_counter),
             [v.numpy() for v in opt.variables])
    assert saved[:2] == (8.0, 2)
    path = tf.train.Checkpoint(optimizer=opt, var=var).save(
        str(tmp_path / "ckpt"))

    var2 = keras.Variable([0.0, 0.0])
    opt2 = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(0.1, momentum=0.9), initial_scale=16,
        dynamic_growth_steps=5)
    opt2.build([var2])
    tf.train.Checkpoint(optimizer=opt2, var=var2).restore(
        path).assert_consumed()
    assert (float(opt2.loss_scale), int(opt2.dynamic_counter)) == saved[:2]
    for mine, theirs in zip(opt2.variables, saved[2]):
        np.testing.assert_array_equal(mine, theirs)


def test_checkpoint_of_keras_own_optimizer_restores_into_ours(tmp_path):
    var = keras.Variable([1.0, 2.0])
    theirs = keras.mixed_precision.LossScaleOptimizer(
        keras.optimizers.SGD(0.1, momentum=0.9), initial_scale=64.0,
        dynamic_growth_steps=10)
    for grad in ([64.0, 64.0], [np.inf, 1.0], [32.0, 32.0]):
        theirs.apply_gradients([(tf.constant(grad), var)])
    assert (float(theirs.dynamic_scale.numpy()),
            int(theirs.step_counter.numpy())) == (32.0, 1)
    path = tf.train.Checkpoint(optimizer=theirs).save(str(tmp_path / "k"))

    var2 = keras.Variable([1.0, 2.0])
    ours = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(0.1, momentum=0.9), initial_scale=64.0,
        dynamic_growth_steps=10)
    ours.build([var2])
    # Every key of Keras' checkpoint has its place in ours, and back.
    status = tf.train.Checkpoint(optimizer=ours).restore(path)
    status.assert_consumed()
    assert (float(ours.loss_scale), int(ours.dynamic_counter)) == (32.0, 1)
    (theirs_momentum,) = [v for v in theirs.inner_optimizer.variables
                          if v.path.endswith("momentum")]
    (our_momentum,) = [v for v in ours.inner_optimizer.variables
                       if v.path.endswith("momentum")]
    np.testing.assert_array_equal(our_momentum, theirs_momentum)
    assert int(ours.iterations) == int(theirs.iterations.numpy())


def test_fixed_scale_checkpoint_round_trip(tmp_path):
    var = keras.Variable([1.0])
    opt = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.Adam(0.1), dynamic=False, initial_scale=4)
    opt.apply_gradients([(tf.constant([4.0]), var)])
    path = tf.train.Checkpoint(optimizer=opt).save(str(tmp_path / "f"))
    var2 = keras.Variable([1.0])
    opt2 = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.Adam(0.1), dynamic=False, initial_scale=4)
    opt2.build([var2])
    tf.train.Checkpoint(optimizer=opt2).restore(path).assert_consumed()
    assert int(opt2.iterations) == 1
    for mine, theirs in zip(opt2.inner_optimizer.variables,
                            opt.inner_optimizer.variables):
        np.testing.assert_array_equal(mine, theirs)


def test_checkpoint_of_ours_restores_into_keras_own_optimizer(tmp_path):
    var = keras.Variable([1.0, 2.0])
    ours = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.Adam(0.1), initial_scale=64.0,
        dynamic_growth_steps=10)
    for grad in ([64.0, 64.0], [np.nan, 1.0]):
        ours.apply_gradients([(tf.constant(grad), var)])
    path = tf.train.Checkpoint(optimizer=ours).save(str(tmp_path / "o"))

    theirs = keras.mixed_precision.LossScaleOptimizer(
        keras.optimizers.Adam(0.1), initial_scale=64.0,
        dynamic_growth_steps=10)
    theirs.build([keras.Variable([1.0, 2.0])])
    tf.train.Checkpoint(optimizer=theirs).restore(path).assert_consumed()
    assert (float(theirs.dynamic_scale.numpy()),
            int(theirs.step_counter.numpy())) == (32.0, 0)
    assert int(theirs.iterations.numpy()) == 2


def test_a_saved_experimental_optimizer_loads_as_the_current_class(tmp_path):
    # TF 2.4 and tf_keras load an experimental optimizer's config as the
    # non-experimental class; so does ours, with no deprecation on load.
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    with pytest.warns(DeprecationWarning):
        opt = tf_lossscale.experimental.LossScaleOptimizer(
            keras.optimizers.SGD(0.5), 64)
    model.compile(optimizer=opt, loss="mse")
    model.fit(np.ones((4, 2), "float32"), np.ones((4, 1), "float32"),
              verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        loaded = keras.models.load_model(path).optimizer
    assert type(loaded) is KerasLossScaleOptimizer
    assert loaded.get_config() == opt.get_config()
    assert (loaded.dynamic, float(loaded.loss_scale), int(loaded.iterations)
            ) == (False, 64.0, 1)
