"""Why a step was skipped, on both Kerases: the planted faults in `fit` and
the telemetry a checkpoint keeps.

Written once and run on each flavour (`tests/_flavours.py`):
`tests/test_skip_record.py` runs these tests on Keras 3,
`tf_keras_cases/cases_monitor.py` on tf_keras, each in its own process.
Where the two Kerases name a variable differently (Keras 3 puts the model's
name in front), the fact is in a table keyed by `flavour.name`.
"""

from __future__ import annotations

from typing import Any, List, Set, Tuple

import _planted_faults as planted
import numpy as np
import pytest
import tensorflow as tf
from _flavours import Flavour

import tf_lossscale

# What a variable's path starts with: Keras 3 names the model, tf_keras not.
VARIABLE_PREFIX = {"keras3": "net/", "tf_keras": ""}


def test_the_planted_model_is_seeded_and_far_from_overflow(flavour):
    """The lines below must come from the planted faults only: the model is
    the same on every build, and trains without a skip at 16 times the
    initial scale when nothing is planted (unseeded, it overflowed by itself
    now and then, and the monitor named layer_19)."""
    keras = flavour.keras
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model, _ = planted.build(keras)
        again, _ = planted.build(keras)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    for a, b in zip(model.get_weights(), again.get_weights()):
        np.testing.assert_array_equal(a, b)
    opt = flavour.wrap(keras.optimizers.SGD(1e-3),
                       initial_scale=planted.INITIAL_SCALE * 16)
    model.compile(optimizer=opt, loss="mse")
    x, y = planted.data()
    model.fit(x, y, batch_size=planted.BATCH, shuffle=False, verbose=0)
    assert int(opt.iterations) == planted.BATCHES
    assert int(opt.skipped_steps) == 0
    assert float(opt.loss_scale) == planted.INITIAL_SCALE * 16


@pytest.mark.parametrize("jit_compile", [
    False, pytest.param(True, marks=pytest.mark.slow)],  # XLA: ~30 s
    ids=["graph", "jit_compile"])
def test_the_monitor_names_the_overflowing_and_the_nan_layer(flavour,
                                                              jit_compile):
    keras = flavour.keras
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model, planter = planted.build(keras)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    opt = flavour.wrap(keras.optimizers.SGD(1e-3),
                       initial_scale=planted.INITIAL_SCALE,
                       min_scale=planted.MIN_SCALE)
    model.compile(optimizer=opt, loss="mse", jit_compile=jit_compile)
    lines: List[str] = []
    monitor = tf_lossscale.LossScaleMonitor(print_fn=lines.append)
    x, y = planted.data()
    history = model.fit(x, y, batch_size=planted.BATCH, shuffle=False,
                        verbose=0, callbacks=[planter, monitor]).history
    print("\n".join(lines))
    prefix = VARIABLE_PREFIX[flavour.name]
    assert lines == planted.expected_lines(prefix)
    record = opt.last_skip
    assert (record.step, record.streak, record.first_step) == (8, 4, 5)
    assert record.names == (f"{prefix}layer_13/kernel",)
    assert record.kinds == ("NaN",)
    assert record.scale == planted.MIN_SCALE and record.count == 1
    assert int(opt.skipped_steps) == 5
    assert history["skipped_steps"] == [5]
    # The epoch ended on a finite step (9): no run, no non-finite gradient.
    assert history["skip_streak"] == [0]
    assert history["nonfinite_gradients"] == [0]


def _checkpoint_keys(path: str) -> Set[str]:
    return {name for name, _ in tf.train.list_variables(path)}


def _skipping(flavour: Flavour, wrapper: Any, skips: int
              ) -> Tuple[Any, List[Any]]:
    """`wrapper` after one applied step (every variable made), then `skips`
    skipped ones (a NaN in the second variable's gradient)."""
    variables = [flavour.variable(np.ones(3, "float32")),
                 flavour.variable(np.ones(2, "float32"))]
    for second in [tf.ones(2)] + [tf.constant([np.nan, 1.0])] * skips:
        wrapper.apply_gradients(zip([tf.ones(3), second], variables))
    return wrapper, variables


def test_save_telemetry_keeps_the_counters_across_a_resume(flavour,
                                                           tmp_path):
    for family in flavour.optimizer_families:
        _resume_with_telemetry(flavour, family, tmp_path / family.__name__)


def _resume_with_telemetry(flavour: Flavour, family: Any, directory: Any
                           ) -> None:
    def ours(skips: int, **kwargs: Any) -> Tuple[Any, List[Any]]:
        return _skipping(flavour, flavour.wrap(family.SGD(0.1), **kwargs),
                         skips)

    saved, _ = ours(2, save_telemetry=True)
    assert saved.get_config()["save_telemetry"] is True
    path = tf.train.Checkpoint(optimizer=saved).save(str(directory / "with"))
    resumed, variables = ours(0, save_telemetry=True)
    assert resumed.last_skip is None
    tf.train.Checkpoint(optimizer=resumed).restore(path).assert_consumed()
    assert int(resumed.skipped_steps) == 2
    record = resumed.last_skip
    assert (record.step, record.streak, record.first_step) == (2, 2, 1)
    # The next skip continues the run it restored.
    resumed.apply_gradients(zip([tf.ones(3), tf.constant([np.nan, 1.0])],
                                variables))
    assert resumed.last_skip.streak == 3 and int(resumed.skipped_steps) == 3

    plain = tf.train.Checkpoint(optimizer=ours(2)[0]).save(
        str(directory / "without"))
    original, _ = _skipping(flavour, flavour.original(family.SGD(0.1)), 2)
    theirs = tf.train.Checkpoint(optimizer=original).save(
        str(directory / "theirs"))
    # Without the option, the keys are exactly the original's; with it,
    # four more.
    assert _checkpoint_keys(plain) == _checkpoint_keys(theirs)
    extra = _checkpoint_keys(path) - _checkpoint_keys(plain)
    assert sorted(k.split("/")[-3] for k in extra) == [
        "last_skip_step", "skip_streak", "skip_streak_first_step",
        "skipped_steps"], extra
