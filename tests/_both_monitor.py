"""`LossScaleMonitor` and `skipped_steps` in real `fit` runs, on both Kerases.

Written once and run on each flavour (`tests/_flavours.py`):
`tests/test_monitor.py` runs these tests on Keras 3,
`tf_keras_cases/cases_monitor.py` on tf_keras, each in its own process.
The data hold a NaN label in known batches, so those steps (and only those)
are skipped: every test knows the exact scale and count after each batch
and epoch, and reads them back from what a user reads: the progress bar's
printed lines, `History`, a `CSVLogger` file and the event files of Keras'
`TensorBoard` callback.
"""

from __future__ import annotations

import csv
import functools
import pathlib
import re
import warnings
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np
import pytest
import tensorflow as tf
from _flavours import Flavour
from tensorboard.backend.event_processing import event_accumulator

import tf_lossscale

# Two epochs of 6 batches of 8; batches 1 and 4 of each epoch hold a NaN.
BATCH = 8
BATCHES = 6
NAN_BATCHES = (1, 4)
INITIAL_SCALE = 1024.0
# After each batch of the two epochs: halved on each NaN batch, never grown
# (dynamic_growth_steps=1000).
BATCH_SKIPS = [0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4]
BATCH_SCALES = [INITIAL_SCALE / 2**n for n in BATCH_SKIPS]
EPOCH_SKIPS = [2, 4]
EPOCH_SCALES = [256.0, 64.0]
LOGGED = ("loss_scale", "skipped_steps")


def nan_data(nan_batches: Sequence[int] = NAN_BATCHES,
             batches: int = BATCHES) -> Tuple[np.ndarray, np.ndarray]:
    """x, y for `batches` batches; the first label of each NaN batch is
    NaN (on replica 0 only, when two replicas split a batch)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batches * BATCH, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    for b in nan_batches:
        y[b * BATCH, 0] = np.nan
    return x, y


def fit(model: Any, callbacks: List[Any], *, epochs: int = 2,
        nan_batches: Sequence[int] = NAN_BATCHES, verbose: int = 0) -> Any:
    """`model.fit` on `nan_data`, batch by batch in order."""
    x, y = nan_data(nan_batches)
    return model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False,
                     verbose=verbose, callbacks=callbacks)


def progress_bar_values(printed: str) -> List[Tuple[float, float]]:
    """(loss_scale, skipped_steps) on each epoch's last progress-bar line."""
    values = []
    for epoch in re.split(r"Epoch \d+/\d+", printed)[1:]:
        found = re.findall(
            r"loss_scale: ([-+.\deE]+) - skipped_steps: ([-+.\deE]+)", epoch)
        assert found, epoch
        values.append((float(found[-1][0]), float(found[-1][1])))
    return values


def csv_rows(path: pathlib.Path) -> List[Dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def tensorboard_scalars(log_dir: pathlib.Path, tag: str) -> List[float]:
    """The values of one scalar tag in the event files, in step order."""
    accumulator = event_accumulator.EventAccumulator(
        str(log_dir), size_guidance={event_accumulator.TENSORS: 0,
                                     event_accumulator.SCALARS: 0})
    accumulator.Reload()
    tags = accumulator.Tags()
    if tag in tags["tensors"]:
        events = sorted(accumulator.Tensors(tag), key=lambda e: e.step)
        return [float(tf.make_ndarray(e.tensor_proto)) for e in events]
    assert tag in tags["scalars"], (tag, tags)
    return [e.value for e in sorted(accumulator.Scalars(tag),
                                    key=lambda e: e.step)]


def check_everything_a_user_reads(printed: str, history: Dict[str, list],
                                  csv_path: pathlib.Path,
                                  log_dir: pathlib.Path) -> None:
    """The progress bar, History, CSVLogger and TensorBoard all agree with
    the known scales and counts."""
    assert progress_bar_values(printed) == list(
        zip(EPOCH_SCALES, map(float, EPOCH_SKIPS)))
    assert history["loss_scale"] == EPOCH_SCALES
    assert history["skipped_steps"] == EPOCH_SKIPS
    rows = csv_rows(csv_path)
    assert [float(r["loss_scale"]) for r in rows] == EPOCH_SCALES
    assert [int(r["skipped_steps"]) for r in rows] == EPOCH_SKIPS
    train = log_dir / "train"
    assert tensorboard_scalars(train, "epoch_loss_scale") == EPOCH_SCALES
    assert tensorboard_scalars(train, "epoch_skipped_steps") == EPOCH_SKIPS
    assert tensorboard_scalars(train, "batch_loss_scale") == BATCH_SCALES
    assert tensorboard_scalars(train, "batch_skipped_steps") == BATCH_SKIPS


class KeySpy:
    """Records which of the monitor's keys a callback's logs held."""

    def __init__(self) -> None:
        self.batch: List[bool] = []
        self.epoch: List[bool] = []

    def hooks(self) -> Dict[str, Any]:
        return {
            "on_train_batch_end": lambda batch, logs=None: self.batch.append(
                set(LOGGED) <= set(logs or {})),
            "on_epoch_end": lambda epoch, logs=None: self.epoch.append(
                set(LOGGED) <= set(logs or {})),
        }


def check_warned_once_and_stopped(caught: List[warnings.WarningMessage],
                                  step: int, scale: str) -> None:
    ours = [w for w in caught if "LossScaleMonitor" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    message = str(ours[0].message)
    assert ours[0].category is RuntimeWarning
    assert f"at step {step}:" in message, message
    assert f"loss scale is now {scale}" in message, message
    assert "not overflow" in message and "bad input data" in message


# --- Models, on the flavour ---------------------------------------------


def compiled_model(flavour: Flavour, initial_scale: float = INITIAL_SCALE,
          steps_per_execution: int = 1) -> Tuple[Any, Any]:
    k = flavour.keras
    built = k.Sequential([k.Input((4,)), k.layers.Dense(
        1, kernel_initializer="zeros")])
    opt = flavour.wrap(k.optimizers.SGD(0.01), initial_scale=initial_scale,
                       dynamic_growth_steps=1000)
    built.compile(optimizer=opt, loss="mse",
                  steps_per_execution=steps_per_execution)
    return built, opt


def logging_callbacks(flavour: Flavour, tmp_path: pathlib.Path) -> List[Any]:
    callbacks = flavour.keras.callbacks
    return [tf_lossscale.LossScaleMonitor(),
            callbacks.CSVLogger(str(tmp_path / "log.csv")),
            callbacks.TensorBoard(str(tmp_path / "tb"), update_freq=1)]


@functools.lru_cache(maxsize=None)
def recording_model(flavour: Flavour) -> type:
    """A Sequential of the flavour that keeps the graph each traced train
    step was built in (in `graphs`)."""

    class RecordingModel(flavour.keras.Sequential):
        graphs: List[Any] = []

        def train_step(self, data: Any) -> Any:
            RecordingModel.graphs.append(tf.compat.v1.get_default_graph())
            return super().train_step(data)

    return RecordingModel


# How many times one `fit` epoch traces the train step: Keras 3 once,
# tf_keras once or twice (every trace the same ops).
TRACES = {"keras3": {1}, "tf_keras": {1, 2}}


def traced_op_types(flavour: Flavour, callbacks: List[Any]) -> List[str]:
    k = flavour.keras
    recording = recording_model(flavour)
    recording.graphs = []
    built = recording([k.Input((4,)), k.layers.Dense(1)])
    built.compile(optimizer=flavour.wrap(k.optimizers.SGD(0.01)), loss="mse")
    fit(built, callbacks, epochs=1)
    assert len(set(recording.graphs)) in TRACES[flavour.name]
    traces = []
    for graph in recording.graphs:
        definition = graph.as_graph_def()
        traces.append(sorted([n.op for n in definition.node] + [
            n.op for f in definition.library.function for n in f.node_def]))
    assert traces and all(t == traces[0] for t in traces)
    return traces[0]


# --- The tests, on the flavour of the process (the `flavour` fixture) -------


def test_fit_shows_scale_and_skips_everywhere_a_user_looks(flavour, tmp_path,
                                                           capsys):
    built, opt = compiled_model(flavour)
    assert type(opt).__name__ == flavour.class_name
    history = fit(built, logging_callbacks(flavour, tmp_path), verbose=1)
    # The progress bar shows the scale after the epoch's last step, not
    # Keras' mean over the epoch (which would be 426.67 for epoch 1).
    check_everything_a_user_reads(capsys.readouterr().out, history.history,
                                  tmp_path / "log.csv", tmp_path / "tb")
    assert int(opt.skipped_steps) == 4 and int(opt.iterations.numpy()) == 12
    assert opt.skipped_steps.dtype == tf.int64


def test_only_callbacks_after_the_monitor_see_its_keys(flavour):
    before, after = KeySpy(), KeySpy()
    built, _ = compiled_model(flavour)
    lambdas = flavour.keras.callbacks.LambdaCallback
    fit(built, [lambdas(**before.hooks()), tf_lossscale.LossScaleMonitor(),
                lambdas(**after.hooks())], epochs=1)
    assert before.batch == [False] * BATCHES and before.epoch == [False]
    assert after.batch == [True] * BATCHES and after.epoch == [True]


def test_under_mirrored_strategy_a_skip_counts_once_not_per_replica(
        flavour, mirrored_strategy, tmp_path, capsys):
    with mirrored_strategy.scope():
        built, opt = compiled_model(flavour)
    # Each NaN is on replica 0 only: both replicas skip, counted once.
    history = fit(built, logging_callbacks(flavour, tmp_path), verbose=1)
    check_everything_a_user_reads(capsys.readouterr().out, history.history,
                                  tmp_path / "log.csv", tmp_path / "tb")
    # Not 8: once per step.
    assert int(opt.skipped_steps) == 4 and int(opt.iterations.numpy()) == 12


def test_max_consecutive_skips_stops_training_with_one_warning(flavour):
    built, opt = compiled_model(flavour, initial_scale=2.0**15)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = fit(built, [tf_lossscale.LossScaleMonitor(
            max_consecutive_skips=3)], epochs=5, nan_batches=range(BATCHES))
    assert int(opt.iterations.numpy()) == 3 and int(opt.skipped_steps) == 3
    assert len(history.history["loss"]) == 1  # Stopped in epoch 1.
    assert history.history["skipped_steps"] == [3]
    check_warned_once_and_stopped(caught, step=3, scale="4096")


def test_an_optimizer_that_is_not_ours_gets_a_clear_type_error(flavour):
    k = flavour.keras
    built = k.Sequential([k.Input((4,)), k.layers.Dense(1)])
    built.compile(optimizer="sgd", loss="mse")
    with pytest.raises(TypeError, match="tf_lossscale.LossScaleOptimizer"):
        fit(built, [tf_lossscale.LossScaleMonitor()])


def test_the_monitor_adds_nothing_to_the_traced_step(flavour):
    """No op, and so no host sync: it reads only after the step ran."""
    with_monitor = traced_op_types(flavour, [tf_lossscale.LossScaleMonitor(
        max_consecutive_skips=5)])
    assert with_monitor == traced_op_types(flavour, [])
    assert not {"PyFunc", "EagerPyFunc", "PyFuncStateless", "PrintV2",
                "Print"} & set(with_monitor)
    assert "AssignVariableOp" in with_monitor  # The skip count, in-graph.


# What a module of each side imports to run the tests above.
__all__ = [name for name in dir() if name.startswith("test_")]
