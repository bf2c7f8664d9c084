"""Subclasses of the public classes, and TF 2.4-2.15's class under the shim.

A subclass that names no flavour (a user's `class My(LossScaleOptimizer)`)
picks the flavour its parent would, joined with itself: it constructs,
trains, keeps its own methods and round-trips its config. The shim binds
`tf.keras.mixed_precision.LossScaleOptimizer` to such a subclass
(`compat.legacy_optimizer`) whose only difference is TF 2.4-2.15's rule for
gradients no scaling method marked: applied as given. Legacy code with
`compile` under `mixed_float16` and a custom `train_step` that applies
`tape.gradient(loss)` then trains as it did, on both Kerases, where it
stalled before (every update divided by 32768).
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_lossscale
from tf_lossscale.compat import legacy_optimizer


class _Plain(tf_lossscale.LossScaleOptimizer):
    pass


class _WithInit(tf_lossscale.LossScaleOptimizer):
    """A subclass with a constructor and a method of its own."""

    def __init__(self, inner, note="default", **kwargs):
        super().__init__(inner, **kwargs)
        self.note = note

    def doubled_scale(self):
        return 2.0 * float(self.loss_scale)


def test_a_subclass_constructs_and_applies_as_ours():
    opt = _Plain(keras.optimizers.SGD(0.5), initial_scale=4.0)
    assert type(opt).__name__ == "_Plain"
    assert isinstance(opt, _Plain)
    assert isinstance(opt, tf_lossscale.LossScaleOptimizer)
    assert isinstance(opt, keras.mixed_precision.LossScaleOptimizer)
    var = keras.Variable([1.0])
    opt.apply_gradients([(tf.constant([4.0]), var)])  # Scaled: 4 / 4 = 1.
    assert var.numpy().tolist() == [0.5]
    opt.apply_gradients([(tf.constant([np.nan]), var)])
    assert var.numpy().tolist() == [0.5]
    assert float(opt.loss_scale) == 2.0 and int(opt.iterations) == 2


def test_a_subclass_keeps_its_constructor_and_methods():
    opt = _WithInit(keras.optimizers.SGD(), note="mine", dynamic=False,
                    initial_scale=8, name="named")
    assert (opt.note, opt.doubled_scale(), opt.name) == ("mine", 16.0,
                                                         "named")
    assert opt.dynamic is False
    with pytest.raises(ValueError, match="initial_scale"):
        _WithInit(keras.optimizers.SGD(), dynamic=False)


def test_a_subclass_round_trips_its_config_and_trains_in_fit():
    opt = _Plain(keras.optimizers.SGD(0.1), initial_scale=64.0,
                 dynamic_growth_steps=3)
    again = _Plain.from_config(opt.get_config())
    assert type(again).__name__ == "_Plain"
    assert (again.initial_scale, again.dynamic_growth_steps) == (64.0, 3)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=opt, loss="mse")
    assert model.optimizer is opt
    model.fit(np.ones((8, 2), "float32"), np.ones((8, 1), "float32"),
              batch_size=4, verbose=0)
    assert int(opt.iterations) == 2


@pytest.mark.parametrize("family", ["current", "legacy"])
def test_a_subclass_picks_each_tf_keras_family(family):
    tf_keras = pytest.importorskip("tf_keras")
    inner = (tf_keras.optimizers.SGD(0.5) if family == "current"
             else tf_keras.optimizers.legacy.SGD(0.5))
    opt = _Plain(inner, initial_scale=4.0)
    flavour = {"current": "TfKerasLossScaleOptimizer",
               "legacy": "TfKerasLegacyLossScaleOptimizer"}[family]
    assert [c.__name__ for c in type(opt).__mro__[:3]] == [
        "_Plain", "_Plain", flavour]
    assert isinstance(opt, tf_keras.mixed_precision.LossScaleOptimizer)
    var = tf.Variable([1.0])
    with tf.GradientTape() as tape:
        loss = opt.get_scaled_loss(tf.reduce_sum(var))
    opt.apply_gradients(zip(opt.get_unscaled_gradients(
        tape.gradient(loss, [var])), [var]))
    assert var.numpy().tolist() == [0.5]


def test_a_subclass_of_the_experimental_class_takes_a_loss_scale():
    class Old(tf_lossscale.experimental.LossScaleOptimizer):
        pass

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        opt = Old(keras.optimizers.SGD(), 128)
    assert isinstance(opt, tf_lossscale.experimental.LossScaleOptimizer)
    assert (opt.dynamic, float(opt.loss_scale)) == (False, 128.0)


def test_legacy_class_applies_unmarked_gradients_as_given():
    """TF 2.4-2.15's rule; ours used directly keeps Keras 3's (scaled)."""
    results = []
    for cls in (legacy_optimizer.LossScaleOptimizer,
                tf_lossscale.LossScaleOptimizer):
        opt = cls(keras.optimizers.SGD(1.0), initial_scale=4.0)
        var = keras.Variable([1.0])
        opt.apply_gradients([(tf.constant([0.5]), var)])
        results.append(var.numpy().tolist())
    assert results == [[0.5], [0.875]]


def test_legacy_class_still_takes_scale_loss_gradients_as_scaled():
    """Keras 3's `fit` marks its gradients with `scale_loss`."""
    opt = legacy_optimizer.LossScaleOptimizer(keras.optimizers.SGD(1.0),
                                              initial_scale=4.0)
    var = keras.Variable([1.0])
    with tf.GradientTape() as tape:
        loss = opt.scale_loss(tf.reduce_sum(0.5 * var))
    opt.apply_gradients(zip(tape.gradient(loss, [var]), [var]))
    assert var.numpy().tolist() == [0.5]


_GUIDE = """
import numpy as np
import tensorflow as tf
keras = tf.keras
keras.mixed_precision.set_global_policy("mixed_float16")

class CustomModel(keras.Model):
    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = tf.reduce_mean(tf.square(tf.cast(y_pred, tf.float32) - y))
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return {"loss": loss}

inputs = keras.Input(shape=(1,))
outputs = keras.layers.Dense(1, kernel_initializer="ones", use_bias=False,
                             dtype="float32")(inputs)
model = CustomModel(inputs, outputs)
model.compile(optimizer=keras.optimizers.SGD(0.01))
model.fit(np.ones((32, 1), "float32"), np.zeros((32, 1), "float32"),
          batch_size=32, epochs=10, verbose=0)
assert isinstance(model.optimizer, keras.mixed_precision.LossScaleOptimizer)
print("KERNEL", float(model.trainable_variables[0].numpy().ravel()[0]))
"""


@pytest.mark.parametrize("legacy_keras", [False, True],
                         ids=["keras3", "tf_keras"])
def test_the_guides_custom_train_step_trains_under_the_shim(tmp_path,
                                                            legacy_keras):
    """TensorFlow's "Customizing what happens in fit" guide, under a
    mixed_float16 policy: ten SGD steps on loss (k - 0)^2 take the kernel
    from 1 to 0.98^10 (= 0.817) as TF 2.4-2.15 did, on both Kerases."""
    script = tmp_path / "guide.py"
    script.write_text(_GUIDE)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_USE_LEGACY_KERAS", None)
    if legacy_keras:
        env["TF_USE_LEGACY_KERAS"] = "1"
    done = subprocess.run(
        [sys.executable, "-m", "tf_lossscale.compat", str(script)],
        capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    kernel = float(done.stdout.split("KERNEL")[1])
    assert kernel == pytest.approx(0.98 ** 10, rel=1e-3)


def test_a_subclass_round_trips_a_keras_file(tmp_path):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=_Plain(keras.optimizers.SGD(0.1),
                                   initial_scale=64.0), loss="mse")
    model.fit(np.ones((4, 2), "float32"), np.ones((4, 1), "float32"),
              verbose=0)
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert type(loaded.optimizer).__name__ == "_Plain"
    assert isinstance(loaded.optimizer, _Plain)
    assert float(loaded.optimizer.initial_scale) == 64.0
    assert int(loaded.optimizer.iterations) == 1
