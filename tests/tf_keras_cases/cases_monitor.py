"""`LossScaleMonitor` and `skipped_steps` in real tf_keras `fit` runs.

Runs under TF_USE_LEGACY_KERAS=1 (see tests/_tf_keras_cases.py). The tests
that hold on both Kerases are written once, in tests/_both_monitor.py (with
the data, the expected scales and counts and the readers of the progress
bar, CSV and TensorBoard files), and run here on tf_keras (imported below;
the `flavour` fixture is tf_keras' in this process).
"""

from __future__ import annotations

from typing import Any, List

import pytest
import tensorflow as tf
import tf_keras
from _both_monitor import *  # noqa: F403 (the tests on both Kerases)
from _both_monitor import compiled_model, fit

import tf_lossscale


def test_a_progress_bar_of_your_own_shows_current_values_too(flavour,
                                                              capsys):
    model, _ = compiled_model(flavour)
    # Listed after the monitor, like any callback that reads its keys.
    fit(model, [tf_lossscale.LossScaleMonitor(),
                tf_keras.callbacks.ProgbarLogger(count_mode="steps")],
        verbose=1)
    printed = capsys.readouterr().out
    assert "loss_scale: 256.0000 - skipped_steps: 2.0000" in printed
    assert "loss_scale: 64.0000 - skipped_steps: 4.0000" in printed


# --- Why a step was skipped (tests/test_skip_record.py has Keras 3's) -------

FAMILIES = [pytest.param(tf_keras.optimizers.SGD, id="tf_keras"),
            pytest.param(tf_keras.optimizers.legacy.SGD, id="legacy")]


@pytest.mark.slow  # About 35 s: 20 layers traced by tf_keras.
def test_the_monitor_names_the_overflowing_and_the_nan_layer():
    # One family (the legacy one shares the step; its loop is tested below).
    sgd = tf_keras.optimizers.SGD
    import _planted_faults as planted
    tf_keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model, planter = planted.build(tf_keras)
    finally:
        tf_keras.mixed_precision.set_global_policy("float32")
    opt = tf_lossscale.LossScaleOptimizer(
        sgd(1e-3), initial_scale=planted.INITIAL_SCALE,
        min_scale=planted.MIN_SCALE)
    model.compile(optimizer=opt, loss="mse")
    lines: List[str] = []
    x, y = planted.data()
    history = model.fit(x, y, batch_size=planted.BATCH, shuffle=False,
                        verbose=0, callbacks=[planter, tf_lossscale.
                                              LossScaleMonitor(
                                                  print_fn=lines.append)])
    assert lines == planted.expected_lines("")
    record = opt.last_skip
    assert (record.step, record.streak, record.first_step) == (8, 4, 5)
    assert record.names == ("layer_13/kernel",)
    assert history.history["skipped_steps"] == [5]
    assert history.history["nonfinite_gradients"] == [0]


@pytest.mark.parametrize("sgd", FAMILIES)
def test_max_consecutive_skips_stops_a_custom_loop(sgd):
    a = tf.Variable([1.0, 1.0], name="a")
    b = tf.Variable([1.0], name="b")
    opt = tf_lossscale.LossScaleOptimizer(sgd(0.1), max_consecutive_skips=2)
    bad = [tf.constant([1.0, float("inf")]), tf.constant([1.0])]
    opt.apply_gradients(zip(bad, [a, b]))
    assert str(opt.last_skip) == (
        "step 0 skipped on replica 0: 1 of 2 gradients non-finite (Inf): a; "
        "scale 2^15")
    with pytest.raises(tf_lossscale.SkipStreakError,
                       match=r"2 steps in a row .* steps 0 to 1; .*: a; "
                             r"scale 2\^14; the scale is now 2\^13"):
        opt.apply_gradients(zip(bad, [a, b]))
    assert opt.get_config()["max_consecutive_skips"] == 2

    traced = tf_lossscale.LossScaleOptimizer(sgd(0.1),
                                             max_consecutive_skips=2)

    @tf.function
    def step(grads: List[tf.Tensor]) -> None:
        traced.apply_gradients(zip(grads, [a, b]))

    step(bad)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="SkipStreakError: 2 steps in a row"):
        step(bad)
    with pytest.raises(tf_lossscale.SkipStreakError):
        traced.raise_if_stuck()
    assert a.numpy().tolist() == [1.0, 1.0]


def test_a_nan_on_replica_1_only_reaches_every_replica_in_the_sum(
        mirrored_strategy):
    """tf_keras' apply_gradients sums the gradients across replicas before
    the check (as tf_keras does), so every replica holds the NaN; Keras 3
    checks each replica's own (tests/test_skip_record.py: replica 1)."""
    with mirrored_strategy.scope():
        a = tf.Variable([1.0, 1.0], name="a")
        b = tf.Variable([1.0], name="b")
        opt = tf_lossscale.LossScaleOptimizer(tf_keras.optimizers.SGD(0.1))

    def replica_step() -> None:
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        nan = tf.where(tf.equal(replica, 1), float("nan"), 1.0)
        opt.apply_gradients(zip([tf.ones(2), tf.reshape(nan, [1])], [a, b]))

    tf.function(lambda: mirrored_strategy.run(replica_step))()
    record = opt.last_skip
    assert (record.replica, record.replicas, record.names) == (0, 2, ("b",))
    assert str(record) == ("step 0 skipped on replica 0 (and 1 other): 1 of "
                           "2 gradients non-finite (NaN): b; scale 2^15")


@pytest.mark.parametrize("sgd", FAMILIES)
def test_save_telemetry_keeps_the_counters_across_a_resume(sgd, tmp_path):
    def skipping(skips: int = 2, **kwargs: Any) -> Any:
        """An applied step (all variables made), then `skips` skipped."""
        var = tf.Variable([1.0, 1.0], name="w")
        opt = tf_lossscale.LossScaleOptimizer(sgd(0.1), **kwargs)
        opt.apply_gradients([(tf.ones(2), var)])
        for _ in range(skips):
            opt.apply_gradients([(tf.constant([float("nan"), 1.0]), var)])
        return opt, var

    saved, var = skipping(save_telemetry=True)
    path = tf.train.Checkpoint(optimizer=saved, var=var).save(
        str(tmp_path / "with"))
    resumed, var = skipping(0, save_telemetry=True)
    assert resumed.last_skip is None
    tf.train.Checkpoint(optimizer=resumed, var=var).restore(
        path).assert_consumed()
    assert int(resumed.skipped_steps) == 2
    assert (resumed.last_skip.step, resumed.last_skip.streak) == (2, 2)

    plain = tf.train.Checkpoint(optimizer=skipping()[0], var=var).save(
        str(tmp_path / "without"))
    own = tf_keras.mixed_precision.LossScaleOptimizer(sgd(0.1))
    own.apply_gradients([(tf.ones(2), var)])
    theirs = tf.train.Checkpoint(optimizer=own, var=var).save(
        str(tmp_path / "theirs"))
    keys = [{k for k, _ in tf.train.list_variables(p)}
            for p in (path, plain, theirs)]
    assert keys[1] == keys[2]  # Default: exactly tf_keras' own keys.
    assert len(keys[0] - keys[1]) == 4
