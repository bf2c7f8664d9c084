"""The scaling-policy knobs (docs/scaling-policy.md) on both Kerases.

The tests here are written once and run on each flavour (`tests/_flavours.py`):
`tests/test_knobs.py` runs them on Keras 3, `tf_keras_cases/cases_knobs.py`
on tf_keras, each in its own process. Every step is checked against the
plain-Python model (`_model.py`), eagerly, in `tf.function` and under
MirroredStrategy, and every skipped step leaves the variable and the slots
bit for bit as they were; bad values raise `ValueError` naming the knob; with
default knobs the config has the original's keys, and a non-default knob
round-trips through the config and (de)serialization.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Callable, Dict, List, Sequence, Tuple

import _model
import numpy as np
import pytest
import tensorflow as tf
from _flavours import Flavour, replica_values

import tf_lossscale

MODES = ["eager", "function", "mirrored"]


def _bits(variables: Sequence[Any]) -> List[bytes]:
    return [v.tobytes() for var in variables for v in replica_values(var)]


def poison(grads: List[tf.Tensor], finite: tf.Tensor) -> List[tf.Tensor]:
    """NaN gradients on the last replica (the only one when not
    distributed) unless `finite`."""
    context = tf.distribute.get_replica_context()
    last = tf.equal(context.replica_id_in_sync_group,
                    context.num_replicas_in_sync - 1)
    bad = tf.logical_and(tf.logical_not(finite), last)
    return [tf.where(bad, g * np.nan, g) for g in grads]


def make(flavour: Flavour, **kwargs: Any) -> Any:
    """A LossScaleOptimizer around a fresh Adam."""
    return flavour.wrap(flavour.optimizers.Adam(0.01, name="adam"), **kwargs)


def build(flavour: Flavour, mode: str, strategy: Any,
          **knobs: Any) -> Tuple[Any, Any, Callable[[bool], None]]:
    """A variable, an optimizer with `knobs`, and a step in `mode`: one
    step of `loss = sum(var**2)` in the flavour's own flow (Keras 3's, as
    `fit` runs it, applies scaled gradients; tf_keras' documented one, which
    its `fit` runs too, unscales them first), NaN on the last replica if not
    `finite`."""
    scope = (strategy.scope() if mode == "mirrored"
             else contextlib.nullcontext())
    with scope:
        var = flavour.variable([1.0, -2.0])
        opt = make(flavour, **knobs)
        opt.build([var])

    def replica_step(finite: tf.Tensor) -> None:
        flavour.scaled_step(opt, lambda: tf.reduce_sum(var * var), [var],
                            edit=lambda grads: poison(grads, finite))

    if mode == "eager":
        fn: Callable[[tf.Tensor], Any] = replica_step
    elif mode == "function":
        fn = tf.function(replica_step)
    else:
        fn = tf.function(
            lambda finite: strategy.run(replica_step, args=(finite,)))
    return var, opt, lambda flag: fn(tf.constant(flag))


def run_and_check(flavour: Flavour, mode: str, strategy: Any,
                  flags: Sequence[bool], **knobs: Any) -> List[float]:
    """Runs `flags` (True: finite) and checks every step against the model.

    After each step: the scale and the counter equal the model's (on every
    replica), `skipped_steps` counts the skipped steps once (not per
    replica), `iterations` counts every step, and a skipped step left the
    variable and every slot bit for bit as they were (an applied one moved
    the variable). Returns the scale after each step.
    """
    var, opt, step = build(flavour, mode, strategy, **knobs)
    initial = opt.initial_scale
    model = _model.PythonLossScale(
        initial, opt.dynamic_growth_steps,
        growth_factor=opt.growth_factor, backoff_factor=opt.backoff_factor,
        min_scale=opt.min_scale, max_scale=opt.max_scale,
        hysteresis=opt.hysteresis)
    scales = []
    for n, flag in enumerate(flags, start=1):
        weights, state = _bits([var]), _bits([var] + flavour.slots(opt))
        step(flag)
        if flag:
            assert _bits([var]) != weights, f"step {n} was not applied"
        else:
            assert _bits([var] + flavour.slots(opt)) == state, (
                f"step {n} was skipped but changed a variable or a slot")
        scale, counter = model.step(flag)
        assert [float(s) for s in replica_values(opt.dynamic_scale)] == [
            scale] * len(replica_values(opt.dynamic_scale)), (n, knobs)
        assert float(opt.loss_scale) == scale
        # A tensor on Keras 3's flavour, the variable on tf_keras' (as
        # tf_keras returns it; int() of a MirroredVariable fails there).
        assert int(tf.convert_to_tensor(opt.dynamic_counter)) == counter
        assert int(opt.skipped_steps) == flags[:n].count(False)
        assert {int(s) for s in replica_values(opt.iterations)} == {n}
        scales.append(scale)
    return scales


# Bad values: each raises ValueError naming the knob.
BAD_KNOBS: List[Tuple[str, Any]] = [
    ("min_scale", 0), ("min_scale", -1.0), ("min_scale", float("nan")),
    ("min_scale", float("inf")), ("min_scale", "1"), ("min_scale", True),
    ("min_scale", 1e-46),  # 0 as a float32.
    ("max_scale", 0.5),  # Below the default min_scale of 1.
    ("max_scale", float("inf")), ("max_scale", 1e39), ("max_scale", "big"),
    ("growth_factor", 1), ("growth_factor", 0.5), ("growth_factor", None),
    ("growth_factor", 1 + 1e-9),  # 1.0 as a float32.
    ("growth_factor", float("nan")),
    ("backoff_factor", 0), ("backoff_factor", 1), ("backoff_factor", 1.5),
    ("backoff_factor", -0.5), ("backoff_factor", None),
    ("backoff_factor", 1 - 1e-9),  # 1.0 as a float32.
    ("hysteresis", 0), ("hysteresis", 1.5), ("hysteresis", "2"),
    ("hysteresis", True), ("hysteresis", None),
]

# Bounds that do not hold the initial scale: (knobs, names in the message).
BAD_BOUNDS: List[Tuple[Dict[str, Any], Tuple[str, ...]]] = [
    ({"min_scale": 4.0, "initial_scale": 2.0}, ("initial_scale",
                                                "min_scale")),
    ({"max_scale": 8.0, "initial_scale": 16.0}, ("initial_scale",
                                                 "max_scale")),
    # The default initial scale, 2**15, is above this max_scale.
    ({"max_scale": 1024.0}, ("initial_scale", "max_scale")),
    ({"min_scale": 2.0, "max_scale": 1.0, "initial_scale": 1.5},
     ("max_scale",)),
    # A subnormal start would read as 0 and never grow.
    ({"min_scale": 1e-40, "initial_scale": 1e-39}, ("initial_scale",
                                                    "2**-126")),
]

# Knobs away from their defaults, each refused with dynamic=False.
NON_DEFAULT_KNOBS: Dict[str, Any] = {
    "min_scale": 0.5, "max_scale": 2.0**20, "growth_factor": 3.0,
    "backoff_factor": 0.25, "hysteresis": 2}

DEFAULT_KNOBS: Dict[str, Any] = {
    "min_scale": 1.0, "max_scale": None, "growth_factor": 2.0,
    "backoff_factor": 0.5, "hysteresis": 1}


def checkpoint_keys(path: str) -> List[str]:
    return sorted(name for name, _ in tf.train.list_variables(path))


@pytest.fixture(params=MODES)
def mode(request: Any) -> str:
    return request.param


# --- The tests, on the flavour of the process (the `flavour` fixture) -------


def test_scale_goes_below_one_with_min_scale_below_one(flavour, mode,
                                                       mirrored_strategy):
    scales = run_and_check(
        flavour, mode, mirrored_strategy, [False] * 6 + [True],
        initial_scale=1.0, min_scale=1 / 16, dynamic_growth_steps=100)
    assert scales == [0.5, 0.25, 0.125, 0.0625, 0.0625, 0.0625, 0.0625]


def test_max_scale_caps_growth(flavour, mode, mirrored_strategy):
    scales = run_and_check(
        flavour, mode, mirrored_strategy, [True] * 4 + [False, True],
        initial_scale=4.0, dynamic_growth_steps=1, max_scale=16.0)
    assert scales == [8.0, 16.0, 16.0, 16.0, 8.0, 16.0]


def test_growth_and_backoff_factors(flavour, mode, mirrored_strategy):
    scales = run_and_check(
        flavour, mode, mirrored_strategy, [True, True, False, True, True],
        initial_scale=8.0, dynamic_growth_steps=2, growth_factor=3.0,
        backoff_factor=0.25)
    assert scales == [8.0, 24.0, 6.0, 6.0, 18.0]


def test_hysteresis_a_single_spike_does_not_halve(flavour, mode,
                                                  mirrored_strategy):
    flags = [False, True, True, True, False, False, False, True]
    scales = run_and_check(
        flavour, mode, mirrored_strategy, flags, initial_scale=8.0,
        dynamic_growth_steps=3, hysteresis=2)
    # One spike: skipped, scale kept. The growth step (3 finite) restarts
    # the count; then the 2nd spike since it backs off, and so does every
    # further one until the next growth.
    assert scales == [8.0, 8.0, 8.0, 16.0, 16.0, 8.0, 4.0, 4.0]


def test_every_knob_at_once_and_skips_change_nothing(flavour, mode,
                                                     mirrored_strategy):
    rng = np.random.default_rng(13)
    flags = [bool(f) for f in rng.random(16) < 0.6]
    run_and_check(
        flavour, mode, mirrored_strategy, flags, initial_scale=3.0,
        dynamic_growth_steps=2, min_scale=0.75, max_scale=40.0,
        growth_factor=1.5, backoff_factor=0.3, hysteresis=2)


@pytest.mark.parametrize("knob, value", BAD_KNOBS)
def test_a_bad_knob_raises_value_error_naming_it(flavour, knob, value):
    with pytest.raises(ValueError, match=knob):
        make(flavour, **{knob: value})


@pytest.mark.parametrize("kwargs, names", BAD_BOUNDS)
def test_bounds_must_hold_the_initial_scale(flavour, kwargs, names):
    with pytest.raises(ValueError) as raised:
        make(flavour, **kwargs)
    for name in names:
        assert name in str(raised.value)


@pytest.mark.parametrize("knob", sorted(NON_DEFAULT_KNOBS))
def test_a_knob_with_dynamic_false_raises_value_error(flavour, knob):
    with pytest.raises(ValueError, match=knob):
        make(flavour, dynamic=False, initial_scale=8.0,
             **{knob: NON_DEFAULT_KNOBS[knob]})
    # At its default it is no knob at all.
    opt = make(flavour, dynamic=False, initial_scale=8.0,
               **{knob: DEFAULT_KNOBS[knob]})
    assert getattr(opt, knob) == DEFAULT_KNOBS[knob]


def test_default_knobs_add_no_config_key(flavour):
    theirs = flavour.original(flavour.optimizers.Adam(0.01, name="adam"))
    implicit = make(flavour, name="o")
    explicit = make(flavour, name="o", **DEFAULT_KNOBS)
    assert set(theirs.get_config()) == flavour.original_config_keys
    assert set(implicit.get_config()) == flavour.config_keys
    assert explicit.get_config() == implicit.get_config()


@pytest.mark.parametrize("knob", sorted(NON_DEFAULT_KNOBS))
def test_a_non_default_knob_is_in_the_config_and_restored(flavour, knob):
    value = NON_DEFAULT_KNOBS[knob]
    opt = make(flavour, name="o", **{knob: value})
    config = opt.get_config()
    assert set(config) == flavour.config_keys | {knob}
    assert config[knob] == value
    # A copy: Keras' deserialize lowercases the inner class name in place.
    restored = tf_lossscale.LossScaleOptimizer.from_config(
        copy.deepcopy(config))
    assert type(restored) is type(opt)
    assert getattr(restored, knob) == value
    assert restored.get_config() == config
    again = flavour.optimizers.deserialize(flavour.optimizers.serialize(opt))
    assert getattr(again, knob) == value


# Where the hysteresis count is saved: tf_keras names it under `loss_scale`;
# Keras 3 names an optimizer's variables by position, the count one more
# after Keras' own (so theirs keep their keys).
BAD_STEPS_KEY = {"keras3": None, "tf_keras": "loss_scale/bad_steps"}


@pytest.mark.parametrize("initial, period, learning_rate, momentum", [
    (64.0, 10, 0.1, 0.9), (8.0, 2, 0.125, 0.5)])
def test_hysteresis_state_is_checkpointed_only_with_hysteresis(
        flavour, tmp_path, initial, period, learning_rate, momentum):
    def step(opt: Any, var: Any, grad: Any) -> None:
        """Hands over `grad` as the flavour's own flow does (tf_keras':
        through get_unscaled_gradients)."""
        scaled = tf.constant(grad) * opt.loss_scale
        (handed,) = flavour.to_apply(opt, [scaled])
        opt.apply_gradients([(handed, var)])

    def trained(**knobs: Any) -> Tuple[Any, Any]:
        """A variable and optimizer after a finite step and a NaN step."""
        var, opt = fresh([1.0, 2.0], **knobs)
        for grad in ([1.0, 1.0], [np.nan, 1.0]):
            step(opt, var, grad)
        return var, opt

    def fresh(value: List[float], **knobs: Any) -> Tuple[Any, Any]:
        var = flavour.variable(value)
        opt = flavour.wrap(
            flavour.optimizers.SGD(learning_rate, momentum=momentum),
            initial_scale=initial, dynamic_growth_steps=period, **knobs)
        opt.build([var])
        return var, opt

    def write(var: Any, opt: Any, name: str) -> str:
        return tf.train.Checkpoint(var=var, optimizer=opt).write(
            str(tmp_path / name))

    plain = checkpoint_keys(write(*trained(min_scale=0.5, growth_factor=3.0),
                                  "plain"))
    assert not any("bad_steps" in key for key in plain)
    var, counting = trained(hysteresis=3)
    # One spike so far (not yet a back-off): the restored count remembers it.
    assert float(counting.loss_scale) == initial
    path = write(var, counting, "counting")
    extra = sorted(set(checkpoint_keys(path)) - set(plain))
    assert len(extra) == 1, extra
    if BAD_STEPS_KEY[flavour.name] is not None:
        assert BAD_STEPS_KEY[flavour.name] in extra[0], extra
    assert tf.train.load_variable(path, extra[0]) == 1
    assert set(plain) <= set(checkpoint_keys(path))

    new_var, restored = fresh([0.0, 0.0], hysteresis=3)
    tf.train.Checkpoint(var=new_var, optimizer=restored).read(
        path).assert_consumed()
    nan = [np.nan, 1.0]
    # The 2nd spike of 3, then the 3rd backs off.
    for expected in (initial, initial / 2):
        step(restored, new_var, nan)
        assert float(restored.loss_scale) == expected
    # Without the restored count, two spikes do not back off.
    new_var, unrestored = fresh([0.0, 0.0], hysteresis=3)
    for _ in range(2):
        step(unrestored, new_var, nan)
    assert float(unrestored.loss_scale) == initial


# What a module of each side imports to run the tests above (with `mode`).
__all__ = ["mode"] + [name for name in dir() if name.startswith("test_")]
