"""The scaling-policy knobs (docs/scaling-policy.md) on the rule and on Keras 3.

`min_scale`, `max_scale`, `growth_factor`, `backoff_factor` and `hysteresis`:

- `state_machine.transition` equals the plain-Python model (`_model.py`),
  bit for bit, for random knobs and step sequences, eagerly and traced;
- the Keras 3 `LossScaleOptimizer` follows the model step by step, eagerly,
  in `tf.function` and under `MirroredStrategy`, and a skipped step changes
  no variable and no slot whatever the knobs;
- bad values raise `ValueError` naming the knob; with default knobs configs
  and checkpoints are those of Keras' own optimizer, non-default knobs
  round-trip through `get_config` / `from_config`, and the hysteresis count
  is in checkpoints only with `hysteresis != 1`.

The optimizer-level tests that hold on both Kerases are written once, in
`_both_knobs.py`: this module runs them on Keras 3 (it imports them, and the
`flavour` fixture is Keras 3's here), `tf_keras_cases/cases_knobs.py` on
tf_keras.
"""

from __future__ import annotations

import copy
import pathlib
import re
from typing import Any, Callable, Dict, List, Tuple

import _flavours
import _model
import keras
import numpy as np
import pytest
import tensorflow as tf
from _both_knobs import *  # noqa: F403 (the tests on both Kerases)
from _both_knobs import (
    DEFAULT_KNOBS,
    NON_DEFAULT_KNOBS,
    build,
    checkpoint_keys,
    make,
    run_and_check,
)
from hypothesis import given, settings
from hypothesis import strategies as st

import tf_lossscale
from tf_lossscale import settings as settings_lib
from tf_lossscale import state_machine

F32_MAX = float(np.finfo(np.float32).max)
F32_TINY = float(np.finfo(np.float32).tiny)  # 2**-126, the least min_scale.


# --- The rule against the model, for random knobs ------------------------


def _f32(low: float, high: float, **kwargs: Any) -> st.SearchStrategy:
    return st.floats(low, high, width=32, allow_nan=False,
                     allow_infinity=False, **kwargs)


@st.composite
def knob_sets(draw: Callable, largest: float = F32_MAX) -> Dict[str, Any]:
    """Random knobs, a period and a start inside the bounds.

    `max_scale` is None (no bound) only when `largest` is the float32
    maximum. `divisor` set means TensorFlow's form (a back-off divides by
    it); otherwise a back-off multiplies by `backoff_factor`.
    """
    min_scale = draw(st.one_of(st.just(1.0), st.just(F32_TINY),
                               _f32(F32_TINY, 2.0**20)))
    bounded = st.one_of(st.just(min_scale), st.just(largest),
                        _f32(min_scale, largest))
    max_scale = draw(st.one_of(st.none(), bounded) if largest == F32_MAX
                     else bounded)
    upper = largest if max_scale is None else max_scale
    return {
        "min_scale": min_scale,
        "max_scale": max_scale,
        "initial": draw(st.one_of(st.just(min_scale), st.just(upper),
                                  _f32(min_scale, upper))),
        "growth_factor": draw(st.one_of(
            st.sampled_from([2.0, 1.1, 3.0, 1e30]),
            _f32(1.0, 1e6, exclude_min=True))),
        "backoff_factor": draw(st.one_of(
            st.sampled_from([0.5, 0.3, 0.1, 1e-30]),
            _f32(0.0, 1.0, exclude_min=True, exclude_max=True).filter(
                lambda b: b >= 1e-38))),
        "divisor": draw(st.one_of(st.none(), st.sampled_from([2.0, 3.0]),
                                  _f32(1.0, 1e6, exclude_min=True))),
        "hysteresis": draw(st.integers(1, 5)),
        "period": draw(st.integers(1, 5)),
    }


def _model_for(k: Dict[str, Any]) -> _model.PythonLossScale:
    if k["divisor"] is None:
        return _model.PythonLossScale(
            k["initial"], k["period"], growth_factor=k["growth_factor"],
            backoff_factor=k["backoff_factor"], min_scale=k["min_scale"],
            max_scale=k["max_scale"], hysteresis=k["hysteresis"])
    return _model.PythonLossScale(
        k["initial"], k["period"], k["divisor"],
        growth_factor=k["growth_factor"], min_scale=k["min_scale"],
        max_scale=k["max_scale"], hysteresis=k["hysteresis"])


def _rule_fields(k: Dict[str, Any]) -> Dict[str, tf.Tensor]:
    """The knobs as tensors (one trace serves every value)."""
    divisor = 2.0 if k["divisor"] is None else k["divisor"]
    maximum = F32_MAX if k["max_scale"] is None else k["max_scale"]
    return {
        "period": tf.constant(k["period"], tf.int64),
        "growth_factor": tf.constant(k["growth_factor"], tf.float32),
        "backoff_divisor": tf.constant(divisor, tf.float32),
        "backoff_factor": tf.constant(k["backoff_factor"], tf.float32),
        "min_scale": tf.constant(k["min_scale"], tf.float32),
        "max_scale": tf.constant(maximum, tf.float32),
        "hysteresis": tf.constant(k["hysteresis"], tf.int64),
    }


def _rule_for(k: Dict[str, Any]) -> state_machine.Rule:
    """The knobs as Python numbers, as the optimizers pass them."""
    divides = k["divisor"] is not None
    return state_machine.Rule(
        period=k["period"], growth_factor=k["growth_factor"],
        backoff_divisor=k["divisor"] if divides else 2.0,
        backoff_factor=None if divides else k["backoff_factor"],
        min_scale=k["min_scale"], max_scale=k["max_scale"],
        hysteresis=k["hysteresis"])


@tf.function
def _traced_transition(state: state_machine.State, finite: tf.Tensor,
                       fields: Dict[str, tf.Tensor],
                       divides: bool) -> state_machine.State:
    if divides:
        fields = {**fields, "backoff_factor": None}
    return state_machine.transition(
        state, finite, state_machine.Rule(**fields))


def _as_python(state: state_machine.State) -> Tuple[float, int, int]:
    assert state.scale.dtype == tf.float32
    assert state.good_steps.dtype == state.bad_steps.dtype == tf.int64
    return (float(state.scale), int(state.good_steps), int(state.bad_steps))


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@settings(deadline=None, max_examples=120)
@given(knobs=knob_sets(), flags=st.lists(st.booleans(), max_size=40))
def test_transition_equals_the_model_for_random_knobs(traced, knobs, flags):
    model = _model_for(knobs)
    rule, fields = _rule_for(knobs), _rule_fields(knobs)
    divides = knobs["divisor"] is not None
    state = state_machine.State(
        tf.constant(knobs["initial"], tf.float32),
        tf.constant(0, tf.int64), tf.constant(0, tf.int64))
    for flag in flags:
        if traced:
            state = _traced_transition(state, tf.constant(flag), fields,
                                       divides)
        else:
            state = state_machine.transition(state, flag, rule)
        expected = (*model.step(flag), model.bad_steps)
        assert _as_python(state) == expected, (flag, knobs)


def test_transition_traces_once_for_tensor_knobs():
    knobs = dict(min_scale=0.25, max_scale=64.0, initial=8.0,
                 growth_factor=3.0, backoff_factor=0.3, divisor=None,
                 hysteresis=2, period=2)
    model = _model_for(knobs)
    fn = tf.function(_traced_transition.python_function)
    state = state_machine.State(tf.constant(8.0), tf.constant(0, tf.int64),
                                tf.constant(0, tf.int64))
    for flag in (True, False, True, True, False, False, False):
        knobs = {**knobs, "growth_factor": 3.0 + flag}  # New values...
        model.growth_factor = np.float32(knobs["growth_factor"])
        state = fn(state, tf.constant(flag), _rule_fields(knobs), False)
        assert _as_python(state) == (*model.step(flag), model.bad_steps)
    assert fn.experimental_get_tracing_count() == 1  # ...one trace.


def test_the_backoff_factor_multiplies_and_the_divisor_divides():
    """`backoff_factor=0.9` takes 1000 to 900, as a user reads it.

    Dividing by the float32 rounding of 1 / 0.9 would give 899.99994.
    """
    start = state_machine.State(1000.0, 0, 0)
    by_factor = state_machine.transition(
        start, False, state_machine.Rule(backoff_factor=0.9))
    by_divisor = state_machine.transition(
        start, False, state_machine.Rule(backoff_divisor=1 / 0.9))
    assert float(by_factor.scale) == 900.0
    assert float(by_divisor.scale) == float(
        np.float32(1000.0) / np.float32(1 / 0.9)) < 900.0


def test_default_rule_of_the_settings_is_tensorflows_rule():
    """Default knobs: `Settings.rule()` steps exactly as TensorFlow's."""
    rule = settings_lib.check_settings(True, 8.0, 2).rule()
    assert not rule.needs_bad_steps
    model = _model.PythonLossScale(8.0, 2, 2.0)
    state = state_machine.State(8.0, 0)
    for flag in (True, True, False, False, False, False, True, True, True):
        state = state_machine.transition(state, flag, rule)
        assert (float(state.scale), int(state.good_steps)) == model.step(flag)


# --- Docs examples (test_monitor.py runs its page's with these too) --------


DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"


def readme_blocks(section: str, page: str = "scaling-policy.md"
                  ) -> List[str]:
    """The ```python blocks of a docs page's `<!-- section:NAME -->`."""
    text = (DOCS / page).read_text()
    start = text.index(f"<!-- section:{section} -->")
    end = text.find("<!-- section:", start + 1)
    return re.findall(r"```python\n(.*?)```",
                      text[start:end if end != -1 else len(text)], re.S)


def run_readme_block(block: str) -> Dict[str, Any]:
    """Runs one README example as written (its asserts included)."""
    namespace: Dict[str, Any] = {"__name__": "readme_example"}
    exec(compile(block, "docs example", "exec"), namespace)
    return namespace


# --- On the Keras 3 optimizer ---------------------------------------------
# The tests of tests/_both_knobs.py run here too (imported above), with the
# `flavour` fixture Keras 3's: the steps against the model in every mode, bad
# values, the config with default and non-default knobs.


KERAS3 = _flavours.keras3()


def test_a_subnormal_min_scale_floors_at_the_smallest_normal_float32(
        mode, mirrored_strategy):
    # TensorFlow flushes subnormal float32s to zero: a floor of 1e-40 itself
    # would let the scale reach 0 and stay there.
    _, opt, step = build(KERAS3, mode, mirrored_strategy,
                         initial_scale=2.0**-125,
                         dynamic_growth_steps=1, min_scale=1e-40)
    assert opt.min_scale == 1e-40
    assert opt.get_config()["min_scale"] == 1e-40
    scales = []
    for flag in [False, False, False, True, True]:
        step(flag)
        scales.append(float(opt.loss_scale))
    assert scales == [2.0**-126, 2.0**-126, 2.0**-126, 2.0**-125, 2.0**-124]


@settings(deadline=None, max_examples=15)
@given(knobs=knob_sets(largest=2.0**40),
       flags=st.lists(st.booleans(), min_size=1, max_size=12))
def test_eager_optimizer_equals_the_model_for_random_knobs(knobs, flags):
    run_and_check(
        KERAS3, "eager", None, flags, initial_scale=knobs["initial"],
        dynamic_growth_steps=knobs["period"], min_scale=knobs["min_scale"],
        max_scale=knobs["max_scale"], growth_factor=knobs["growth_factor"],
        backoff_factor=knobs["backoff_factor"],
        hysteresis=knobs["hysteresis"])


def test_knobs_are_keyword_only_and_integral_floats_are_accepted():
    with pytest.raises(TypeError):
        tf_lossscale.LossScaleOptimizer(
            keras.optimizers.SGD(), True, 8.0, 10, "name", 0.5)
    opt = make(KERAS3, hysteresis=2.0, growth_factor=3)
    assert (opt.hysteresis, opt.growth_factor) == (2, 3.0)
    assert type(opt.hysteresis) is int


def test_every_knob_round_trips_through_the_config():
    opt = make(KERAS3, name="o", initial_scale=3.0, **NON_DEFAULT_KNOBS)
    restored = tf_lossscale.LossScaleOptimizer.from_config(
        copy.deepcopy(opt.get_config()))
    for knob, value in NON_DEFAULT_KNOBS.items():
        assert getattr(restored, knob) == value
    assert restored.get_config() == opt.get_config()


def _trained(make: Callable[..., Any], **knobs: Any) -> Tuple[Any, Any]:
    """A variable and optimizer after a finite step and a NaN step."""
    var = keras.Variable([1.0, 2.0])
    opt = make(keras.optimizers.SGD(0.1, momentum=0.9), initial_scale=64.0,
               dynamic_growth_steps=10, **knobs)
    for grad in ([64.0, 64.0], [np.nan, 1.0]):
        opt.apply_gradients([(tf.constant(grad), var)])
    return var, opt


def _fresh(make: Callable[..., Any], **knobs: Any) -> Tuple[Any, Any]:
    var = keras.Variable([0.0, 0.0])
    opt = make(keras.optimizers.SGD(0.1, momentum=0.9), initial_scale=64.0,
               dynamic_growth_steps=10, **knobs)
    opt.build([var])
    return var, opt


def _state(opt: Any) -> Tuple[float, int, int]:
    scale = opt.dynamic_scale
    return (float(np.asarray(scale)), int(np.asarray(opt.step_counter)),
            int(np.asarray(opt.iterations)))


def test_default_knob_checkpoints_interchange_with_keras_own(tmp_path):
    theirs_cls = keras.mixed_precision.LossScaleOptimizer
    _, ours = _trained(tf_lossscale.LossScaleOptimizer, **DEFAULT_KNOBS)
    assert _state(ours) == (32.0, 0, 2)
    path = tf.train.Checkpoint(optimizer=ours).write(str(tmp_path / "ours"))
    _, theirs = _fresh(theirs_cls)
    tf.train.Checkpoint(optimizer=theirs).read(path).assert_consumed()
    assert _state(theirs) == (32.0, 0, 2)

    _, theirs = _trained(theirs_cls)
    path2 = tf.train.Checkpoint(optimizer=theirs).write(
        str(tmp_path / "theirs"))
    # The same keys: neither `skipped_steps` nor a hysteresis count.
    assert checkpoint_keys(path2) == checkpoint_keys(path)
    _, ours = _fresh(tf_lossscale.LossScaleOptimizer, **DEFAULT_KNOBS)
    tf.train.Checkpoint(optimizer=ours).read(path2).assert_consumed()
    # Keras' own optimizer does not advance iterations on a skipped step.
    assert _state(ours) == (32.0, 0, 1)


def test_readme_scaling_policy_example_runs_as_written():
    (block,) = readme_blocks("scaling-policy")
    namespace = run_readme_block(block)
    assert namespace["opt"].hysteresis == 2
    assert float(namespace["opt"].loss_scale) == 4.0
