"""`save_telemetry=True` in Keras 3's `.keras` files; the default file is Keras'.

A real `fit` skips steps on planted NaN targets; `model.save` +
`keras.saving.load_model` carry `skipped_steps` and the run of skipped
steps with the option, and a file written without it holds exactly what one
written with Keras' own LossScaleOptimizer holds, loading into a model that
uses Keras' optimizer and back. (Checkpoints: tests/test_skip_record.py;
tf_keras: tf_keras_cases/cases_monitor.py.)
"""

from __future__ import annotations

import io
import warnings
import zipfile
from typing import Any, Dict, List, Tuple

import keras
import numpy as np

import tf_lossscale

NAN = np.nan


def _model(optimizer: Any) -> keras.Model:
    model = keras.Sequential(
        [keras.Input((3,)), keras.layers.Dense(2, name="dense")],
        name="telemetry_net")
    model.compile(optimizer=optimizer, loss="mse")
    return model


def _data(targets: List[float]) -> Tuple[np.ndarray, np.ndarray]:
    """One batch of 2 rows per target; a NaN target makes a skipped step."""
    x = np.arange(6 * len(targets), dtype="float32").reshape(-1, 3) / 10
    y = np.repeat(np.array(targets, "float32"), 2)[:, None] * np.ones(
        (1, 2), "float32")
    return x, y


def _fit(model: keras.Model, targets: List[float]) -> None:
    x, y = _data(targets)
    model.fit(x, y, batch_size=2, shuffle=False, verbose=0)


def _h5_datasets(path: str) -> Dict[str, Tuple[Tuple[int, ...], str]]:
    """Every array of a `.keras` file's weights, by path: shape and dtype."""
    import h5py

    with zipfile.ZipFile(path) as archive:
        data = io.BytesIO(archive.read("model.weights.h5"))
    found: Dict[str, Tuple[Tuple[int, ...], str]] = {}
    with h5py.File(data, "r") as f:
        f.visititems(lambda name, obj: found.__setitem__(
            name, (obj.shape, str(obj.dtype)))
            if isinstance(obj, h5py.Dataset) else None)
    return found


def _optimizer_state(model: keras.Model) -> List[List[Any]]:
    return [np.asarray(v).tolist() for v in model.optimizer.variables]


def test_model_save_carries_skipped_steps_and_the_run_of_skips(tmp_path):
    opt = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(0.01, momentum=0.5), save_telemetry=True)
    model = _model(opt)
    _fit(model, [1.0, NAN, NAN])  # Steps 1 and 2 skipped.
    assert int(opt.skipped_steps) == 2
    assert (opt.last_skip.step, opt.last_skip.streak,
            opt.last_skip.first_step) == (2, 2, 1)
    path = str(tmp_path / "with.keras")
    model.save(path)
    assert {k for k in _h5_datasets(path) if "telemetry" in k} == {
        f"optimizer/_loss_scale_telemetry/vars/{key}" for key in (
            "skipped_steps", "last_skip_step", "skip_streak",
            "skip_streak_first_step")}

    loaded = keras.saving.load_model(path)
    restored = loaded.optimizer
    assert restored is not opt and restored.save_telemetry
    assert int(restored.skipped_steps) == 2
    record = restored.last_skip
    assert (record.step, record.streak, record.first_step) == (2, 2, 1)
    assert str(record) == ("step 2 skipped, the last of 2 in a row from "
                           "step 1 (restored from a save, which keeps no "
                           "gradients or scale)")
    assert _optimizer_state(loaded) == _optimizer_state(model)
    # Keras' own optimizer takes the file too; it reads no telemetry.
    _load_into(keras.mixed_precision.LossScaleOptimizer, loaded, path)
    # The next skip continues the run the file held, and the count.
    _fit(loaded, [NAN])
    record = restored.last_skip
    assert (record.step, record.streak, record.first_step) == (3, 3, 1)
    assert int(restored.skipped_steps) == 3
    _fit(loaded, [1.0, NAN])  # An applied step ends the run.
    record = restored.last_skip
    assert (record.step, record.streak, record.first_step) == (5, 1, 5)
    assert int(restored.skipped_steps) == 4


def test_a_default_file_is_keras_own_and_loads_both_ways(tmp_path):
    ours = _model(tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(
        0.01, momentum=0.5)))
    _fit(ours, [1.0, NAN, 1.0])
    theirs = _model(keras.mixed_precision.LossScaleOptimizer(
        keras.optimizers.SGD(0.01, momentum=0.5)))
    _fit(theirs, [2.0, 1.0])
    paths = {name: str(tmp_path / f"{name}.keras") for name in ("o", "t")}
    ours.save(paths["o"])
    theirs.save(paths["t"])
    # The same arrays, by path, shape and dtype: no telemetry in ours.
    assert _h5_datasets(paths["o"]) == _h5_datasets(paths["t"])

    # Ours into a model compiled with Keras' own optimizer, and back.
    _load_into(keras.mixed_precision.LossScaleOptimizer, ours, paths["o"])
    loaded = _load_into(tf_lossscale.LossScaleOptimizer, theirs, paths["t"])
    assert float(loaded.optimizer.loss_scale) == 2.0**15
    assert int(loaded.optimizer.iterations) == 2


def _load_into(wrapper: Any, source: keras.Model, path: str) -> keras.Model:
    """A fresh model with `wrapper`, built, that loads `path` (written from
    `source`) with no warning (Keras warns when it skips optimizer state)."""
    target = _model(wrapper(keras.optimizers.SGD(0.01, momentum=0.5)))
    target.optimizer.build(target.trainable_variables)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        target.load_weights(path)
    assert _optimizer_state(target) == _optimizer_state(source)
    assert [w.tolist() for w in target.get_weights()] == [
        w.tolist() for w in source.get_weights()]
    return target
