"""`LossScaleMonitor` and `skipped_steps` in real tf_keras `fit` runs.

Runs under TF_USE_LEGACY_KERAS=1 (see tests/_tf_keras_cases.py). The tests
that hold on both Kerases are written once, in tests/_both_monitor.py (with
the data, the expected scales and counts and the readers of the progress
bar, CSV and TensorBoard files), and run here on tf_keras (imported below;
the `flavour` fixture is tf_keras' in this process).
"""

from __future__ import annotations

from typing import List

import pytest
import tensorflow as tf
import tf_keras
from _both_monitor import *  # noqa: F403 (the tests on both Kerases)
from _both_monitor import compiled_model, fit
from _both_skip_record import *  # noqa: F403 (the tests on both Kerases)

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


# --- Why a step was skipped (the shared ones: tests/_both_skip_record.py) ---

FAMILIES = [pytest.param(tf_keras.optimizers.SGD, id="tf_keras"),
            pytest.param(tf_keras.optimizers.legacy.SGD, id="legacy")]


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


