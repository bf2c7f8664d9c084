"""The tf_keras flavour through checkpoints and saved models.

Runs under TF_USE_LEGACY_KERAS=1 (see tests/_tf_keras_cases.py).
"""

import warnings

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import tf_lossscale

OURS = tf_lossscale.LossScaleOptimizer
THEIRS = tf_keras.mixed_precision.LossScaleOptimizer


def _trained(make):
    """A variable and an optimizer after 3 finite steps and one NaN step.

    The scale (8 -> 16 -> 8), counter (0), iterations (4) and momentum are
    then all away from their initial values.
    """
    var = tf.Variable([1.0, 2.0])
    opt = make(tf_keras.optimizers.SGD(0.125, momentum=0.5),
               initial_scale=8.0, dynamic_growth_steps=2)
    for grad in ([1.0, 1.0], [2.0, -1.0], [np.nan, 1.0], [0.5, 0.5]):
        (unscaled,) = opt.get_unscaled_gradients(
            [tf.constant(grad) * opt.loss_scale])
        opt.apply_gradients([(unscaled, var)])
    return var, opt


def _fresh(make):
    var = tf.Variable([0.0, 0.0])
    opt = make(tf_keras.optimizers.SGD(0.125, momentum=0.5),
               initial_scale=8.0, dynamic_growth_steps=2)
    opt.build([var])
    return var, opt


def _state(var, opt):
    return ([v.numpy().tolist() for v in opt.inner_optimizer.variables],
            var.numpy().tolist(), float(opt.loss_scale),
            int(opt.dynamic_counter))


@pytest.mark.parametrize("writer, reader", [
    (OURS, OURS), (THEIRS, OURS), (OURS, THEIRS)],
    ids=["ours_to_ours", "tf_keras_to_ours", "ours_to_tf_keras"])
def test_checkpoint_restores_scale_counter_iterations_and_slots(
        tmp_path, writer, reader):
    var, opt = _trained(writer)
    assert (float(opt.loss_scale), int(opt.iterations)) == (8.0, 4)
    path = tf.train.Checkpoint(var=var, optimizer=opt).write(
        str(tmp_path / "ckpt"))
    new_var, new_opt = _fresh(reader)
    tf.train.Checkpoint(var=new_var, optimizer=new_opt).read(
        path).assert_consumed()
    assert _state(new_var, new_opt) == _state(var, opt)


def test_checkpoint_keys_are_tf_keras_own_wrappers(tmp_path):
    keys = []
    for make in (OURS, THEIRS):
        var, opt = _trained(make)
        path = tf.train.Checkpoint(var=var, optimizer=opt).write(
            str(tmp_path / make.__name__))
        keys.append(sorted(name for name, _ in tf.train.list_variables(path)))
    assert keys[0] == keys[1]
    assert "optimizer/loss_scale/current_loss_scale/.ATTRIBUTES/" \
        "VARIABLE_VALUE" in keys[0]


def test_checkpoint_of_the_bare_inner_optimizer_restores_its_slots(tmp_path):
    var = tf.Variable([1.0, 2.0])
    inner = tf_keras.optimizers.SGD(0.125, momentum=0.5)
    inner.apply_gradients([(tf.constant([1.0, 3.0]), var)])
    path = tf.train.Checkpoint(var=var, optimizer=inner).write(
        str(tmp_path / "ckpt"))
    new_var, opt = _fresh(OURS)
    tf.train.Checkpoint(var=new_var, optimizer=opt).read(path)
    assert [v.numpy().tolist() for v in opt.inner_optimizer.variables] == [
        v.numpy().tolist() for v in inner.variables]
    assert float(opt.loss_scale) == 8.0


def _fitted_model():
    seeded = tf_keras.initializers.GlorotUniform
    model = tf_keras.Sequential([
        tf_keras.layers.Dense(4, input_shape=(3,),
                              kernel_initializer=seeded(seed=0)),
        tf_keras.layers.Dense(1, dtype="float32",
                              kernel_initializer=seeded(seed=1))])
    opt = OURS(tf_keras.optimizers.Adam(0.01), initial_scale=2.0**10,
               dynamic_growth_steps=3)
    model.compile(optimizer=opt, loss="mse")
    rng = np.random.default_rng(2)
    x = rng.normal(size=(16, 3)).astype("float32")
    y = rng.normal(size=(16, 1)).astype("float32")
    model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    assert (int(opt.iterations), float(opt.loss_scale)) == (8, 2.0**12)
    return model


def _optimizer_state(opt):
    return [v.numpy().tolist() for v in opt.variables]


@pytest.mark.filterwarnings("ignore:You are saving your model as an HDF5")
@pytest.mark.parametrize("filename", ["model.h5", "model.keras"])
def test_model_file_round_trip_keeps_optimizer_config_and_state(
        tmp_path, mixed_float16, filename):
    model = _fitted_model()
    path = str(tmp_path / filename)
    model.save(path)
    loaded = tf_keras.models.load_model(path)
    assert type(loaded.optimizer) is type(model.optimizer)
    assert loaded.optimizer.get_config() == model.optimizer.get_config()
    # Adam's slots, iterations, then the scale and the counter.
    assert _optimizer_state(loaded.optimizer) == _optimizer_state(
        model.optimizer)
    assert float(loaded.optimizer.loss_scale) == 2.0**12


def test_saved_model_keeps_the_config_and_the_state_in_its_variables(
        tmp_path, mixed_float16):
    """tf_keras restores no optimizer state from a SavedModel by itself."""
    model = _fitted_model()
    path = str(tmp_path / "saved_model")
    model.save(path, save_format="tf")
    loaded = tf_keras.models.load_model(path)
    assert type(loaded.optimizer) is type(model.optimizer)
    assert loaded.optimizer.get_config() == model.optimizer.get_config()
    loaded.load_weights(path + "/variables/variables")
    loaded.optimizer.build(loaded.trainable_variables)
    assert _optimizer_state(loaded.optimizer) == _optimizer_state(
        model.optimizer)


@pytest.mark.parametrize("family", ["current", "legacy"])
def test_a_deserialized_experimental_optimizer_is_the_current_class(family):
    """As tf_keras deserializes "LossScaleOptimizerV1" (and TF 2.4 did)."""
    optimizers = {"current": tf_keras.optimizers,
                  "legacy": tf_keras.optimizers.legacy}[family]
    with pytest.warns(DeprecationWarning):
        old = tf_lossscale.experimental.LossScaleOptimizer(
            optimizers.SGD(2.0, momentum=0.5),
            tf_lossscale.DynamicLossScale(2.0, 3))
    current = type(OURS(optimizers.SGD()))
    config = tf_keras.optimizers.serialize(old)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        restored = tf_keras.optimizers.deserialize(config)
    assert type(restored) is current
    assert restored.get_config() == old.get_config()
    assert (restored.dynamic, restored.initial_scale,
            restored.dynamic_growth_steps) == (True, 2.0, 3)
    # The class's own from_config still builds the experimental class, as
    # TF 2.4's LossScaleOptimizerV1.from_config did.
    with pytest.warns(DeprecationWarning):
        again = type(old).from_config(old.get_config())
    assert type(again) is type(old)


# save_telemetry=True in whole-model files (Keras 3: test_telemetry_saving.py).

FAMILIES = [pytest.param(tf_keras.optimizers.SGD, id="current"),
            pytest.param(tf_keras.optimizers.legacy.SGD, id="legacy")]


def _telemetry_of(opt):
    record = opt.last_skip
    return (int(opt.skipped_steps), None if record is None else (
        record.step, record.streak, record.first_step))


@pytest.mark.filterwarnings("ignore:You are saving your model as an HDF5")
@pytest.mark.parametrize("sgd", FAMILIES)
def test_model_files_that_keep_optimizer_state_keep_the_telemetry(
        tmp_path, sgd):
    """h5 and .keras keep it where they keep the scale (the current family:
    its `variables`); a SavedModel's variables keep it in both families
    (it is a checkpoint dependency). The legacy family's h5 holds its
    `weights` (the inner optimizer's, as tf_keras' own wrapper's) and its
    .keras no optimizer state at all: no scale there, no telemetry."""
    model = tf_keras.Sequential([tf_keras.layers.Dense(1, input_shape=(3,))])
    opt = OURS(sgd(0.01), save_telemetry=True)
    model.compile(optimizer=opt, loss="mse")
    x = np.ones((8, 3), "float32")
    y = np.array([1, 1, 1, 1, np.nan, np.nan, np.nan, np.nan], "float32")
    model.fit(x, y, batch_size=2, shuffle=False, verbose=0)  # 2 and 3 skip.
    saved = _telemetry_of(opt)
    assert saved == (2, (3, 2, 2))
    legacy = sgd is tf_keras.optimizers.legacy.SGD
    kept = {}
    for name in ("m.h5", "m.keras", "sm"):
        path = str(tmp_path / name)
        model.save(path, save_format="tf" if name == "sm" else None)
        loaded = tf_keras.models.load_model(path)
        if name == "sm":
            loaded.load_weights(path + "/variables/variables")
        assert loaded.optimizer.save_telemetry
        kept[name] = _telemetry_of(loaded.optimizer)
    assert kept == {"m.h5": (0, None) if legacy else saved,
                    "m.keras": (0, None) if legacy else saved, "sm": saved}
