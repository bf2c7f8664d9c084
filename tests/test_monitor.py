"""`LossScaleMonitor` and `skipped_steps` in real Keras 3 `fit` runs.

The data hold a NaN label in known batches, so those steps (and only those)
are skipped: every test knows the exact scale and count after each batch
and epoch, and reads them back from what a user reads: the progress bar's
printed lines, `History`, a `CSVLogger` file and the event files of Keras'
`TensorBoard` callback. The tests that hold on both Kerases are written
once, in `_both_monitor.py`, with the data and the readers: this module runs
them on Keras 3, `tf_keras_cases/cases_monitor.py` on tf_keras.
"""

from __future__ import annotations

import re
import warnings
from typing import Any, Tuple

import _flavours
import keras
import pytest
from _both_monitor import *  # noqa: F403 (the tests on both Kerases)
from _both_monitor import (
    BATCHES,
    INITIAL_SCALE,
    check_warned_once_and_stopped,
    compiled_model,
    csv_rows,
    fit,
    tensorboard_scalars,
)
from test_knobs import readme_blocks, run_readme_block

import tf_lossscale

# --- Keras 3 ----------------------------------------------------------------


# The tests of tests/_both_monitor.py run here too (imported above), with
# the `flavour` fixture Keras 3's: fit shows the scale and the skips
# everywhere a user looks, under MirroredStrategy too; only callbacks after
# the monitor see its keys; the stop; the monitor adds nothing to the step.

KERAS3 = _flavours.keras3()


def _model(initial_scale: float = INITIAL_SCALE,
           steps_per_execution: int = 1) -> Tuple[keras.Model, Any]:
    return compiled_model(KERAS3, initial_scale, steps_per_execution)


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
