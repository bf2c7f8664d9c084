"""The scaling-policy knobs on the tf_keras flavour (docs/scaling-policy.md).

Runs under TF_USE_LEGACY_KERAS=1 (see tests/_tf_keras_cases.py).
The flavour-free helpers and tables come from tests/test_knobs.py, which
runs the same tests on Keras 3: each step against the plain-Python model,
eagerly, in `tf.function` and under MirroredStrategy, with every skipped
step leaving the variable and the slots bit for bit as they were.
"""

from __future__ import annotations

import copy
from typing import Any, Dict, List, Tuple

import numpy as np
import pytest
import tensorflow as tf
import tf_keras
from test_knobs import (
    BAD_BOUNDS,
    BAD_KNOBS,
    DEFAULT_KNOBS,
    MODES,
    NON_DEFAULT_KNOBS,
    Flavour,
    check_bad_bounds,
    check_bad_knob,
    check_knob_refused_when_fixed,
    checkpoint_keys,
    poison,
    run_and_check,
)

import tf_lossscale

OURS = tf_lossscale.LossScaleOptimizer
THEIRS = tf_keras.mixed_precision.LossScaleOptimizer


class TfKeras(Flavour):
    def make(self, **kwargs: Any) -> Any:
        return OURS(tf_keras.optimizers.Adam(0.01, name="adam"), **kwargs)

    def variable(self, value: List[float]) -> Any:
        return tf.Variable(value)

    def replica_step(self, opt: Any, var: Any, finite: tf.Tensor) -> None:
        # TensorFlow's documented flow, which tf_keras' `fit` runs too.
        with tf.GradientTape() as tape:
            loss = opt.get_scaled_loss(tf.reduce_sum(var * var))
        grads = opt.get_unscaled_gradients(tape.gradient(loss, [var]))
        opt.apply_gradients(zip(poison(grads, finite), [var]))


TF_KERAS = TfKeras()


@pytest.fixture(params=MODES)
def mode(request: Any) -> str:
    return request.param


def test_the_flavour_is_tf_keras():
    assert type(TF_KERAS.make()).__name__ == "TfKerasLossScaleOptimizer"


def test_scale_goes_below_one_with_min_scale_below_one(mode,
                                                       mirrored_strategy):
    scales = run_and_check(
        TF_KERAS, mode, mirrored_strategy, [False] * 6 + [True],
        initial_scale=1.0, min_scale=1 / 16, dynamic_growth_steps=100)
    assert scales == [0.5, 0.25, 0.125, 0.0625, 0.0625, 0.0625, 0.0625]


def test_max_scale_caps_growth(mode, mirrored_strategy):
    scales = run_and_check(
        TF_KERAS, mode, mirrored_strategy, [True] * 4 + [False, True],
        initial_scale=4.0, dynamic_growth_steps=1, max_scale=16.0)
    assert scales == [8.0, 16.0, 16.0, 16.0, 8.0, 16.0]


def test_growth_and_backoff_factors(mode, mirrored_strategy):
    scales = run_and_check(
        TF_KERAS, mode, mirrored_strategy, [True, True, False, True, True],
        initial_scale=8.0, dynamic_growth_steps=2, growth_factor=3.0,
        backoff_factor=0.25)
    assert scales == [8.0, 24.0, 6.0, 6.0, 18.0]


def test_hysteresis_a_single_spike_does_not_halve(mode, mirrored_strategy):
    flags = [False, True, True, True, False, False, False, True]
    scales = run_and_check(
        TF_KERAS, mode, mirrored_strategy, flags, initial_scale=8.0,
        dynamic_growth_steps=3, hysteresis=2)
    assert scales == [8.0, 8.0, 8.0, 16.0, 16.0, 8.0, 4.0, 4.0]


def test_every_knob_at_once_and_skips_change_nothing(mode, mirrored_strategy):
    rng = np.random.default_rng(13)
    flags = [bool(f) for f in rng.random(16) < 0.6]
    run_and_check(
        TF_KERAS, mode, mirrored_strategy, flags, initial_scale=3.0,
        dynamic_growth_steps=2, min_scale=0.75, max_scale=40.0,
        growth_factor=1.5, backoff_factor=0.3, hysteresis=2)


@pytest.mark.parametrize("knob, value", BAD_KNOBS)
def test_a_bad_knob_raises_value_error_naming_it(knob, value):
    check_bad_knob(TF_KERAS, knob, value)


@pytest.mark.parametrize("kwargs, names", BAD_BOUNDS)
def test_bounds_must_hold_the_initial_scale(kwargs, names):
    check_bad_bounds(TF_KERAS, kwargs, names)


@pytest.mark.parametrize("knob", sorted(NON_DEFAULT_KNOBS))
def test_a_knob_with_dynamic_false_raises_value_error(knob):
    check_knob_refused_when_fixed(TF_KERAS, knob)


def test_default_knobs_add_no_config_key():
    theirs = THEIRS(tf_keras.optimizers.Adam(0.01, name="adam"))
    implicit = TF_KERAS.make()
    explicit = TF_KERAS.make(**DEFAULT_KNOBS)
    assert set(implicit.get_config()) == set(theirs.get_config())
    assert explicit.get_config() == implicit.get_config()


@pytest.mark.parametrize("knob", sorted(NON_DEFAULT_KNOBS))
def test_a_non_default_knob_is_in_the_config_and_restored(knob):
    value = NON_DEFAULT_KNOBS[knob]
    plain_keys = set(TF_KERAS.make().get_config())
    opt = TF_KERAS.make(**{knob: value})
    config = opt.get_config()
    assert set(config) == plain_keys | {knob}
    assert config[knob] == value
    restored = OURS.from_config(copy.deepcopy(config))
    assert type(restored) is type(opt)
    assert getattr(restored, knob) == value
    assert restored.get_config() == config
    again = tf_keras.optimizers.deserialize(
        tf_keras.optimizers.serialize(opt))
    assert getattr(again, knob) == value


def _trained(make: Any, **knobs: Any) -> Tuple[Any, Any]:
    """A variable and an optimizer after a finite step and a NaN step."""
    var = tf.Variable([1.0, 2.0])
    opt = make(tf_keras.optimizers.SGD(0.125, momentum=0.5),
               initial_scale=8.0, dynamic_growth_steps=2, **knobs)
    for grad in ([1.0, 1.0], [np.nan, 1.0]):
        (unscaled,) = opt.get_unscaled_gradients(
            [tf.constant(grad) * opt.loss_scale])
        opt.apply_gradients([(unscaled, var)])
    return var, opt


def _fresh(make: Any, **knobs: Any) -> Tuple[Any, Any]:
    var = tf.Variable([0.0, 0.0])
    opt = make(tf_keras.optimizers.SGD(0.125, momentum=0.5),
               initial_scale=8.0, dynamic_growth_steps=2, **knobs)
    opt.build([var])
    return var, opt


def _state(var: Any, opt: Any) -> Tuple[Any, ...]:
    return ([v.numpy().tolist() for v in opt.inner_optimizer.variables],
            var.numpy().tolist(), float(opt.loss_scale),
            int(opt.dynamic_counter))


def _write(var: Any, opt: Any, path: Any) -> str:
    return tf.train.Checkpoint(var=var, optimizer=opt).write(str(path))


@pytest.mark.parametrize("writer, reader", [(OURS, THEIRS), (THEIRS, OURS)],
                         ids=["ours_to_tf_keras", "tf_keras_to_ours"])
def test_default_knob_checkpoints_interchange_with_tf_keras_own(
        tmp_path, writer, reader):
    def make(inner: Any, **kwargs: Any) -> Any:
        knobs: Dict[str, Any] = DEFAULT_KNOBS if writer is OURS else {}
        return writer(inner, **kwargs, **knobs)

    var, opt = _trained(make)
    assert float(opt.loss_scale) == 4.0
    path = _write(var, opt, tmp_path / "ckpt")
    new_var, new_opt = _fresh(reader)
    tf.train.Checkpoint(var=new_var, optimizer=new_opt).read(
        path).assert_consumed()
    assert _state(new_var, new_opt) == _state(var, opt)


def test_default_knob_checkpoints_hold_tf_keras_own_keys(tmp_path):
    ours = _write(*_trained(OURS, **DEFAULT_KNOBS), tmp_path / "ours")
    theirs = _write(*_trained(THEIRS), tmp_path / "theirs")
    # Neither `skipped_steps` nor a hysteresis count.
    assert checkpoint_keys(ours) == checkpoint_keys(theirs)


def test_hysteresis_state_is_checkpointed_only_with_hysteresis(tmp_path):
    plain = checkpoint_keys(_write(
        *_trained(OURS, min_scale=0.5, growth_factor=3.0), tmp_path / "p"))
    assert not any("bad_steps" in key for key in plain)
    var, counting = _trained(OURS, hysteresis=3)
    assert float(counting.loss_scale) == 8.0  # One spike: no back-off.
    path = _write(var, counting, tmp_path / "counting")
    extra = sorted(set(checkpoint_keys(path)) - set(plain))
    assert len(extra) == 1 and "loss_scale/bad_steps" in extra[0], extra
    assert tf.train.load_variable(path, extra[0]) == 1

    new_var, restored = _fresh(OURS, hysteresis=3)
    tf.train.Checkpoint(var=new_var, optimizer=restored).read(
        path).assert_consumed()
    for expected in (8.0, 4.0):  # The 2nd spike of 3, then the 3rd.
        (nan,) = restored.get_unscaled_gradients([tf.constant([np.nan, 1.])])
        restored.apply_gradients([(nan, new_var)])
        assert float(restored.loss_scale) == expected
