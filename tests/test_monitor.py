"""`LossScaleMonitor` and `skipped_steps` in real Keras 3 `fit` runs.

The data hold a NaN label in known batches, so those steps (and only those)
are skipped: every test knows the exact scale and count after each batch
and epoch, and reads them back from what a user reads: the progress bar's
printed lines, `History`, a `CSVLogger` file and the event files of Keras'
`TensorBoard` callback. The same runs for tf_keras are in
`tf_keras_cases/cases_monitor.py`, which imports the Keras-free helpers
from here.
"""

from __future__ import annotations

import csv
import pathlib
import re
import warnings
from typing import Any, Dict, List, Sequence, Tuple

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator
from test_knobs import readme_blocks, run_readme_block

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


# --- Keras 3 ----------------------------------------------------------------


def _model(initial_scale: float = INITIAL_SCALE,
           steps_per_execution: int = 1) -> Tuple[keras.Model, Any]:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(
        1, kernel_initializer="zeros")])
    opt = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(0.01), initial_scale=initial_scale,
        dynamic_growth_steps=1000)
    model.compile(optimizer=opt, loss="mse",
                  steps_per_execution=steps_per_execution)
    return model, opt


def _logging_callbacks(tmp_path: pathlib.Path) -> List[Any]:
    return [tf_lossscale.LossScaleMonitor(),
            keras.callbacks.CSVLogger(str(tmp_path / "log.csv")),
            keras.callbacks.TensorBoard(str(tmp_path / "tb"), update_freq=1)]


def test_fit_shows_scale_and_skips_everywhere_a_user_looks(tmp_path,
                                                           capsys):
    model, opt = _model()
    history = fit(model, _logging_callbacks(tmp_path), verbose=1)
    check_everything_a_user_reads(capsys.readouterr().out, history.history,
                                  tmp_path / "log.csv", tmp_path / "tb")
    assert int(opt.skipped_steps) == 4 and int(opt.iterations.numpy()) == 12
    assert opt.skipped_steps.dtype == tf.int64


def test_only_callbacks_after_the_monitor_see_its_keys():
    before, after = KeySpy(), KeySpy()
    model, _ = _model()
    fit(model, [keras.callbacks.LambdaCallback(**before.hooks()),
                tf_lossscale.LossScaleMonitor(),
                keras.callbacks.LambdaCallback(**after.hooks())], epochs=1)
    assert before.batch == [False] * BATCHES and before.epoch == [False]
    assert after.batch == [True] * BATCHES and after.epoch == [True]


def test_under_mirrored_strategy_a_skip_counts_once_not_per_replica(
        mirrored_strategy, tmp_path, capsys):
    with mirrored_strategy.scope():
        model, opt = _model()
    # Each NaN is on replica 0 only: both replicas skip, counted once.
    history = fit(model, _logging_callbacks(tmp_path), verbose=1)
    check_everything_a_user_reads(capsys.readouterr().out, history.history,
                                  tmp_path / "log.csv", tmp_path / "tb")
    assert int(opt.skipped_steps) == 4 and int(opt.iterations.numpy()) == 12


def test_max_consecutive_skips_stops_training_with_one_warning():
    model, opt = _model(initial_scale=2.0**15)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = fit(model, [tf_lossscale.LossScaleMonitor(
            max_consecutive_skips=3)], epochs=5, nan_batches=range(BATCHES))
    assert int(opt.iterations.numpy()) == 3 and int(opt.skipped_steps) == 3
    assert len(history.history["loss"]) == 1  # Stopped in epoch 1.
    assert history.history["skipped_steps"] == [3]
    check_warned_once_and_stopped(caught, step=3, scale="4096")


def test_the_warning_says_when_the_scale_sits_at_its_floor():
    model, _ = _model(initial_scale=2.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(model, [tf_lossscale.LossScaleMonitor(max_consecutive_skips=4)],
            nan_batches=range(BATCHES))
    check_warned_once_and_stopped(caught, step=4, scale="1")
    assert "at its floor, min_scale" in str(caught[-1].message)


def test_skips_that_are_not_consecutive_do_not_stop_training():
    model, opt = _model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(model, [tf_lossscale.LossScaleMonitor(max_consecutive_skips=2)],
            nan_batches=(0, 2, 4))
    assert int(opt.iterations.numpy()) == 12 and int(opt.skipped_steps) == 6
    assert not [w for w in caught if "LossScaleMonitor" in str(w.message)]


def test_with_several_steps_per_batch_it_stops_once_k_steps_skipped():
    model, opt = _model(initial_scale=2.0**15, steps_per_execution=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(model, [tf_lossscale.LossScaleMonitor(max_consecutive_skips=4)],
            nan_batches=range(BATCHES))
    # The callback runs after steps 3 and 6: 6 skipped in a row >= 4.
    assert int(opt.iterations.numpy()) == 6
    check_warned_once_and_stopped(caught, step=6, scale="512")


@pytest.mark.parametrize("value", [0, -1, 1.5, "3", True])
def test_a_bad_max_consecutive_skips_raises(value):
    with pytest.raises(ValueError, match="max_consecutive_skips"):
        tf_lossscale.LossScaleMonitor(max_consecutive_skips=value)


def test_an_optimizer_that_is_not_ours_gets_a_clear_type_error():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(TypeError, match="tf_lossscale.LossScaleOptimizer"):
        fit(model, [tf_lossscale.LossScaleMonitor()])


class RecordingModel(keras.Sequential):
    """Keeps the graph each traced train step was built in."""

    graphs: List[Any] = []

    def train_step(self, data: Any) -> Any:
        RecordingModel.graphs.append(tf.compat.v1.get_default_graph())
        return super().train_step(data)


def _traced_op_types(callbacks: List[Any]) -> List[str]:
    RecordingModel.graphs = []
    model = RecordingModel([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(0.01)), loss="mse")
    fit(model, callbacks, epochs=1)
    (graph,) = set(RecordingModel.graphs)  # Traced once.
    definition = graph.as_graph_def()
    return sorted([n.op for n in definition.node] + [
        n.op for f in definition.library.function for n in f.node_def])


def test_the_monitor_adds_nothing_to_the_traced_step():
    """No op, and so no host sync: it reads only after the step ran."""
    with_monitor = _traced_op_types([tf_lossscale.LossScaleMonitor(
        max_consecutive_skips=5)])
    assert with_monitor == _traced_op_types([])
    assert not {"PyFunc", "EagerPyFunc", "PyFuncStateless", "PrintV2",
                "Print"} & set(with_monitor)
    assert "AssignVariableOp" in with_monitor  # The skip count, in-graph.


def test_readme_monitoring_examples_run_as_written(tmp_path, monkeypatch,
                                                   capsys):
    monkeypatch.chdir(tmp_path)
    fit_example, loop_example = readme_blocks("monitoring", "debugging.md")
    assert "LossScaleMonitor(" in fit_example
    assert "tf.summary.scalar" in loop_example
    run_readme_block(fit_example)
    printed = capsys.readouterr().out.splitlines()
    # Keras numbers default names (sequential_3, dense_7) in a busy process.
    plain = [re.sub(r"sequential(_\d+)?/|(?<=dense)_\d+", "", line)
             for line in printed]
    # A NaN label: the loss is NaN, the forward pass (the batch) made it.
    assert plain == [
        f"step {step} skipped on replica 0: the loss was NaN: the forward "
        "pass made it (an activation, the loss function or the input "
        f"batch); 2 of 2 gradients non-finite in dense; scale {scales}"
        for step, scales in ((1, "2^10 -> 2^9"), (9, "2^9 -> 2^8"))]
    rows = csv_rows(tmp_path / "training_log.csv")
    assert [float(r["loss_scale"]) for r in rows] == [512.0, 256.0]
    assert [int(r["skipped_steps"]) for r in rows] == [1, 2]
    # The page's fit example logs to CSV; TensorBoard is read back in
    # test_fit_shows_scale_and_skips_everywhere_a_user_looks.
    run_readme_block(loop_example)
    loop = tmp_path / "logs" / "custom_loop"
    assert tensorboard_scalars(loop, "loss_scale") == [1024.0, 512.0, 512.0]
    assert tensorboard_scalars(loop, "skipped_steps") == [0, 1, 1]
