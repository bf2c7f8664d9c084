"""Differential tests: our Keras 3 flavour against Keras 3's LossScaleOptimizer.

The same scenario runs on `tf_lossscale.LossScaleOptimizer(inner)` and on
`keras.mixed_precision.LossScaleOptimizer(inner)` (each with its own, equally
configured inner optimizer and its own, equal model variables), in Keras'
two flows:

- `scale_loss` inside the tape, then `apply` / `apply_gradients` with the
  scaled gradients (what `Model.fit` does);
- `apply` of gradients that carry the scale without any `scale_loss` call
  (what Keras' own test file does).

Hypothesis generates the inner optimizer (SGD, SGD with momentum, Adam), the
initial scale, the growth steps (ints and integral floats) and the steps:
dense and sparse (`tf.IndexedSlices`, through `tf.gather`) gradients with
finite, huge, NaN and Inf values. After every step the model variables, the
inner optimizer's slots, the scale and the counter must be bit-identical,
and the return values of the same types. Checkpoints restore both ways with
`assert_consumed()`.

Where a deliberate difference of docs/differences.md applies, the test asserts
that difference instead of equality:

- `iterations` advances on a skipped step on ours, not on Keras';
- the scale never falls below 1 on ours (Keras halves it to 0.5, ...);
- the scale never grows to inf on ours (Keras doubles 2**127 to inf);
- a NaN step with a fixed scale is skipped by ours; Keras has no fixed
  scale (it rejects `dynamic=False` and points at the inner optimizer's
  `loss_scale_factor`, which applies the NaN step).

After the scale differs on purpose, the two trajectories no longer match,
so the scenario ends at that step.
"""

import os
import tempfile

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context, event

import tf_lossscale

NAN, INF = float("nan"), float("inf")
F32_MAX = float(np.finfo(np.float32).max)
# No "explain" phase: it reruns a failure hundreds of times.
SETTINGS = dict(deadline=None, phases=[
    Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

INNERS = {
    "sgd": lambda: keras.optimizers.SGD(0.5, name="inner"),
    "momentum": lambda: keras.optimizers.SGD(0.25, momentum=0.9,
                                             name="inner"),
    "adam": lambda: keras.optimizers.Adam(0.1, name="inner"),
}
FINITE = [0.0, 1.0, -2.5, 0.3, 1e-20, 3e38, -1e30]
TINY = [0.0, 1e-20, -1e-30]
BAD = [NAN, INF, -INF]
ROWS = 4


def _make(kind, inner, **kwargs):
    cls = (tf_lossscale.LossScaleOptimizer if kind == "ours"
           else keras.mixed_precision.LossScaleOptimizer)
    return cls(INNERS[inner](), name="lso", **kwargs)


def _model_variables():
    return [tf.Variable([1.0, -2.0, 3.0], name="w"),
            tf.Variable(np.arange(2 * ROWS, dtype=np.float32).reshape(
                ROWS, 2), name="e")]


def _loss(variables, c_w, c_e, ids):
    w, e = variables
    return tf.reduce_sum(w * c_w) + tf.reduce_sum(tf.gather(e, ids) * c_e)


def _scale(opt):
    return tf.convert_to_tensor(opt.dynamic_scale)


def _step(opt, variables, c_w, c_e, ids, flow, method):
    """One step of `flow`; returns what `apply`/`apply_gradients` returned."""
    if flow == "scale_loss":
        with tf.GradientTape() as tape:
            loss = opt.scale_loss(_loss(variables, c_w, c_e, ids))
        grads = tape.gradient(loss, variables)
    else:  # gradients that carry the scale, no scale_loss call
        with tf.GradientTape() as tape:
            loss = _loss(variables, c_w, c_e, ids) * _scale(opt)
        grads = tape.gradient(loss, variables)
    assert isinstance(grads[1], tf.IndexedSlices)
    if method == "apply":
        return opt.apply(grads, variables)
    return opt.apply_gradients(zip(grads, variables))


def _note(text):
    """Counts `text` in hypothesis' statistics (nothing outside it)."""
    if currently_in_test_context():
        event(text)


def _bits(values):
    return [np.asarray(v).tobytes() for v in values]


def _snapshot(opt, variables):
    """Everything compared after a step (iterations apart)."""
    inner = opt.inner_optimizer
    iterations = inner.iterations
    slots = [v for v in inner.variables
             if v is not iterations and "learning_rate" not in v.path]
    return {
        "variables": _bits(v.numpy() for v in variables),
        "slots": _bits(v.numpy() for v in slots),
        "slot_paths": [v.path.split("/")[-1] for v in slots],
        "scale": np.float32(opt.dynamic_scale.numpy()).tobytes(),
        "counter": int(opt.step_counter.numpy()),
    }


@st.composite
def steps(draw, max_size=7):
    out = []
    for _ in range(draw(st.integers(1, max_size))):
        # One in four steps has tiny gradients only: finite even at 2**127.
        pool = TINY if draw(st.integers(0, 3)) == 0 else FINITE
        c_w = draw(st.lists(st.sampled_from(pool), min_size=3, max_size=3))
        c_e = draw(st.lists(st.sampled_from(pool), min_size=2, max_size=2))
        ids = draw(st.lists(st.integers(0, ROWS - 1), min_size=1,
                            max_size=3))
        if draw(st.integers(0, 3)) == 0:  # one in four poisoned
            target = draw(st.sampled_from([c_w, c_e]))
            target[draw(st.integers(0, len(target) - 1))] = draw(
                st.sampled_from(BAD))
        out.append((np.float32(c_w), np.float32(c_e),
                    np.int32(ids)))
    return out


def _expected_finite(scale, c_w, c_e, ids, dense=False):
    """NumPy's verdict on the scaled gradients (float32, as TF computes).

    `dense`: the embedding's gradient made dense, which sums the rows of
    repeated ids (and may overflow where the rows alone do not).
    """
    with np.errstate(over="ignore", invalid="ignore"):
        g_w = np.float32(scale) * c_w
        g_e = np.float32(scale) * np.broadcast_to(c_e, (len(ids), 2))
        if dense:
            summed = np.zeros((ROWS, 2), np.float32)
            np.add.at(summed, ids, g_e)
            g_e = summed
    return bool(np.all(np.isfinite(g_w)) and np.all(np.isfinite(g_e)))


INITIAL_SCALES = st.one_of(
    st.sampled_from([0.5, 1.0, 1.5, 2.0]),           # near the floor
    st.sampled_from([3.0, 1024.0, 2.0**15, 2.0**126]),
    st.sampled_from([2.0**127, 3e38]))               # a growth overflows
GROWTH_STEPS = st.one_of(st.integers(1, 3), st.integers(1, 3).map(float))


def _compare_trajectory(pair, variables, trajectory, methods, run_step,
                        returns_checked=True):
    """Runs `trajectory` on both; asserts equality, or the deliberate
    difference at the step where one applies (and stops there).

    `run_step(k, c_w, c_e, ids, method)` runs one step on `pair[k]`.
    """
    ours, theirs = pair
    growth = theirs.dynamic_growth_steps
    iterations = int(ours.iterations.numpy())
    skipped = int(ours.skipped_steps)
    for i, ((c_w, c_e, ids), method) in enumerate(zip(trajectory, methods)):
        scale = float(theirs.dynamic_scale.numpy())
        counter = int(theirs.step_counter.numpy())
        assert np.float32(scale) == np.float32(ours.dynamic_scale.numpy())
        before = _snapshot(ours, variables[0])
        finite = _expected_finite(scale, c_w, c_e, ids)
        returned = [run_step(k, c_w, c_e, ids, method) for k in (0, 1)]
        if returns_checked and method == "apply":
            assert returned == [None, None]
        elif returns_checked:
            # Both return a Keras int64 variable. Keras' is the wrapper's
            # own `_iterations`, which its `apply` never advances (it stays
            # 0); ours is `iterations`, the inner optimizer's.
            assert all(isinstance(r, keras.Variable) and r.dtype == "int64"
                       for r in returned)
            assert int(returned[1].numpy()) == 0
            assert returned[0] is ours.iterations
            assert returned[1] is not theirs.iterations
        # Deliberate difference: `iterations` counts skipped steps on ours,
        # not on Keras'. Keras' is then advanced by hand, so that optimizers
        # whose update reads it (Adam's bias correction) stay comparable.
        assert int(ours.iterations.numpy()) == iterations + 1
        assert int(theirs.iterations.numpy()) == iterations + finite
        iterations += 1
        skipped += not finite
        assert int(ours.skipped_steps) == skipped
        if not finite:
            theirs.inner_optimizer.iterations.assign_add(1)
        mine = _snapshot(ours, variables[0])
        keras_ = _snapshot(theirs, variables[1])
        assert mine["variables"] == keras_["variables"]
        assert mine["slots"] == keras_["slots"]
        assert mine["slot_paths"] == keras_["slot_paths"]
        assert mine["counter"] == keras_["counter"]
        if not finite:
            _note("a skipped step")
            assert mine["variables"] == before["variables"]
            assert mine["slots"] == before["slots"]
            assert mine["counter"] == 0
        keras_scale = float(theirs.dynamic_scale.numpy())
        our_scale = float(ours.dynamic_scale.numpy())
        if not finite and scale * 0.5 < 1.0:
            # Deliberate difference: the floor of 1.
            assert keras_scale == scale * 0.5
            assert our_scale == 1.0
            _note("stopped at the floor difference")
            return i + 1
        if finite and counter + 1 == growth and scale * 2.0 > F32_MAX:
            # Deliberate difference: no growth to inf.
            assert keras_scale == INF and our_scale == scale
            assert mine["counter"] == 0
            _note("stopped at the growth-to-inf difference")
            return i + 1
        assert mine["scale"] == keras_["scale"]
    return len(trajectory)


def _eager_pair(inner, initial, growth):
    pair = [_make(kind, inner, initial_scale=initial,
                  dynamic_growth_steps=growth) for kind in ("ours", "keras")]
    variables = [_model_variables(), _model_variables()]
    for opt, v in zip(pair, variables):
        opt.build(v)
    return pair, variables


FLOWS = st.sampled_from(["scale_loss", "scaled_gradients"])
METHODS = st.lists(st.sampled_from(["apply", "apply_gradients"]),
                   min_size=7, max_size=7)


@settings(max_examples=150, **SETTINGS)
@given(inner=st.sampled_from(sorted(INNERS)), initial=INITIAL_SCALES,
       growth=GROWTH_STEPS, trajectory=steps(), flow=FLOWS, methods=METHODS)
def test_eager_trajectories_equal_keras_except_the_deliberate_differences(
        inner, initial, growth, trajectory, flow, methods):
    pair, variables = _eager_pair(inner, initial, growth)
    # Configs are equal, plus our `dynamic` (docs/differences.md); an integral
    # float `growth` is kept by Keras and made an int by ours: equal values.
    assert pair[0].get_config() == {**pair[1].get_config(), "dynamic": True}
    assert type(pair[0].dynamic_growth_steps) is int

    def run_step(k, c_w, c_e, ids, method):
        return _step(pair[k], variables[k], c_w, c_e, ids, flow, method)

    _compare_trajectory(pair, variables, trajectory, methods, run_step)


# One traced step function per (inner, growth steps, flow, method) and
# implementation; hypothesis resets the state and sets the initial scale.
_TRACED = {}
SIGNATURE = [tf.TensorSpec([3], tf.float32), tf.TensorSpec([2], tf.float32),
             tf.TensorSpec([None], tf.int32)]


def _traced(config):
    if config not in _TRACED:
        inner, growth, flow, method = config
        pair, variables = _eager_pair(inner, 2.0, growth)
        functions = []
        for opt, v in zip(pair, variables):
            def step(c_w, c_e, ids, opt=opt, v=v):
                _step(opt, v, c_w, c_e, ids, flow, method)
            functions.append(tf.function(step, input_signature=SIGNATURE))
        state = [[x.numpy() for x in _all_variables(opt, v)]
                 for opt, v in zip(pair, variables)]
        _TRACED[config] = (pair, variables, functions, state)
    return _TRACED[config]


def _all_variables(opt, variables):
    return list(variables) + list(opt.variables)


TRACED_CONFIGS = [
    ("momentum", 1, "scale_loss", "apply"),
    ("adam", 2, "scaled_gradients", "apply"),
    ("sgd", 2.0, "scale_loss", "apply_gradients"),
    ("adam", 3, "scale_loss", "apply_gradients"),
]


@settings(max_examples=60, **SETTINGS)
@given(config=st.sampled_from(TRACED_CONFIGS), initial=INITIAL_SCALES,
       trajectory=steps())
def test_tf_function_trajectories_equal_keras_except_the_deliberate_ones(
        config, initial, trajectory):
    pair, variables, functions, state = _traced(config)
    for opt, v, values in zip(pair, variables, state):
        for variable, value in zip(_all_variables(opt, v), values):
            variable.assign(value)
        opt.dynamic_scale.assign(initial)

    def run_step(k, c_w, c_e, ids, method):
        return functions[k](c_w, c_e, ids)

    _compare_trajectory(pair, variables, trajectory, [config[3]] * 7,
                        run_step, returns_checked=False)
    assert [f.experimental_get_tracing_count() for f in functions] == [1, 1]


# ------------------------------------------------- the deliberate differences

def _one_step(pair, variables, c_w, flow="scale_loss"):
    for opt, v in zip(pair, variables):
        _step(opt, v, np.float32(c_w), np.float32([0.0, 0.0]),
              np.int32([0]), flow, "apply")


@pytest.mark.parametrize("initial", [1.0, 1.5, 0.5])
def test_nan_step_halves_keras_scale_below_one_but_ours_stops_at_one(initial):
    pair, variables = _eager_pair("momentum", initial, 5)
    _one_step(pair, variables, [NAN, 1.0, 1.0])
    ours, theirs = pair
    assert float(theirs.dynamic_scale.numpy()) == initial / 2
    assert float(ours.dynamic_scale.numpy()) == 1.0
    # Both skipped the step: nothing moved, the counter restarted.
    for v in variables:
        np.testing.assert_array_equal(v[0].numpy(), [1.0, -2.0, 3.0])
    assert int(ours.step_counter.numpy()) == int(
        theirs.step_counter.numpy()) == 0
    # iterations: ours counts the skipped step, Keras' does not.
    assert int(ours.iterations.numpy()) == 1
    assert int(theirs.iterations.numpy()) == 0


def test_growth_overflows_keras_scale_to_inf_but_ours_stays_finite():
    pair, variables = _eager_pair("sgd", 2.0**127, 1)
    ours, theirs = pair
    _one_step(pair, variables, [1e-20, 0.0, 0.0])
    assert float(theirs.dynamic_scale.numpy()) == INF
    assert float(ours.dynamic_scale.numpy()) == 2.0**127
    assert int(ours.step_counter.numpy()) == int(
        theirs.step_counter.numpy()) == 0
    # Both applied the first step alike.
    np.testing.assert_array_equal(variables[0][0].numpy(),
                                  variables[1][0].numpy())
    # Then Keras' inf scale makes every gradient inf: its steps skip and its
    # scale halves to inf again; ours applies.
    before = [v[0].numpy().copy() for v in variables]
    _one_step(pair, variables, [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(variables[1][0].numpy(), before[1])
    assert float(theirs.dynamic_scale.numpy()) == INF
    np.testing.assert_array_equal(variables[0][0].numpy(),
                                  before[0] - np.float32(0.5))


def test_keras_refuses_a_fixed_scale_ours_has_one():
    with pytest.raises(ValueError, match="dynamic=False"):
        keras.mixed_precision.LossScaleOptimizer(
            keras.optimizers.SGD(), dynamic=False, initial_scale=8.0)
    ours = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(), dynamic=False, initial_scale=8.0)
    assert ours.dynamic is False and ours.dynamic_counter is None
    assert float(ours.loss_scale) == 8.0


@settings(max_examples=30, **SETTINGS)
@given(inner=st.sampled_from(sorted(INNERS)),
       value=st.sampled_from([1, 2, 3, 8.0, 1024, 2.0**15]),
       trajectory=steps(), flow=FLOWS)
def test_fixed_scale_equals_keras_loss_scale_factor_until_a_nan_step(
        inner, value, trajectory, flow):
    """Keras' replacement for `dynamic=False` is the inner optimizer's
    `loss_scale_factor`. Finite steps match it bit for bit; a non-finite
    step is skipped by ours (docs/differences.md) and written into the
    variables by Keras'."""
    ours = tf_lossscale.LossScaleOptimizer(
        INNERS[inner](), dynamic=False, initial_scale=value)
    theirs = INNERS[inner]()
    theirs.loss_scale_factor = value
    variables = [_model_variables(), _model_variables()]
    ours.build(variables[0])
    theirs.build(variables[1])
    for i, (c_w, c_e, ids) in enumerate(trajectory):
        finite = _expected_finite(value, c_w, c_e, ids, dense=True)
        before = _bits(v.numpy() for v in variables[0])
        for opt, v in zip((ours, theirs), variables):
            if flow == "scale_loss":
                with tf.GradientTape() as tape:
                    loss = opt.scale_loss(_loss(v, c_w, c_e, ids))
            else:
                with tf.GradientTape() as tape:
                    loss = _loss(v, c_w, c_e, ids) * np.float32(value)
            # Dense gradients: Keras' loss_scale_factor cannot divide
            # tf.IndexedSlices (TypeError in its base optimizer's apply).
            grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, v)]
            opt.apply(grads, v)
        assert float(ours.loss_scale) == float(value)
        assert int(ours.iterations.numpy()) == i + 1
        assert int(theirs.iterations.numpy()) == i + 1
        if finite:
            assert _bits(v.numpy() for v in variables[0]) == _bits(
                v.numpy() for v in variables[1])
            assert _bits(v.numpy() for v in ours.inner_optimizer.variables
                         ) == _bits(v.numpy() for v in theirs.variables)
            continue
        _note("a non-finite step with a fixed scale")
        assert _bits(v.numpy() for v in variables[0]) == before
        assert not all(np.all(np.isfinite(v.numpy())) for v in variables[1])
        assert int(ours.skipped_steps) == 1
        return


# ---------------------------------------------------------------- checkpoints

def _checkpoint_keys(path):
    return sorted(name for name, _ in tf.train.list_variables(path))


@settings(max_examples=15, **SETTINGS)
@given(inner=st.sampled_from(sorted(INNERS)), initial=INITIAL_SCALES,
       growth=st.integers(1, 3), trajectory=steps(max_size=4),
       ours_saves=st.booleans())
def test_checkpoints_restore_both_ways_with_assert_consumed(
        inner, initial, growth, trajectory, ours_saves):
    kinds = ("ours", "keras") if ours_saves else ("keras", "ours")
    writer = _make(kinds[0], inner, initial_scale=initial,
                   dynamic_growth_steps=growth)
    written = _model_variables()
    writer.build(written)
    for c_w, c_e, ids in trajectory:
        _step(writer, written, c_w, c_e, ids, "scale_loss", "apply")
    reader = _make(kinds[1], inner, initial_scale=4.0,
                   dynamic_growth_steps=growth)
    read = [tf.Variable(tf.zeros_like(v), name=v.name.split(":")[0])
            for v in written]
    reader.build(read)
    with tempfile.TemporaryDirectory() as directory:
        path = tf.train.Checkpoint(optimizer=writer).write(
            os.path.join(directory, "writer"))
        tf.train.Checkpoint(optimizer=reader).read(path).assert_consumed()
        other = tf.train.Checkpoint(optimizer=reader).write(
            os.path.join(directory, "reader"))
        keys = _checkpoint_keys(path)
        assert keys == _checkpoint_keys(other)
    assert _snapshot(reader, read) == _snapshot(writer, written)
    assert int(reader.iterations.numpy()) == int(writer.iterations.numpy())
    assert "optimizer/dynamic_scale/.ATTRIBUTES/VARIABLE_VALUE" in keys
    assert "optimizer/step_counter/.ATTRIBUTES/VARIABLE_VALUE" in keys


# ------------------------------------- behaviours Keras' own test file checks
# (tests/originals/COVERAGE.md names these), each run on both classes.

KERAS_LSO = keras.mixed_precision.LossScaleOptimizer
CLASSES = pytest.mark.parametrize(
    "cls", [tf_lossscale.LossScaleOptimizer, KERAS_LSO],
    ids=["ours", "keras"])


@CLASSES
@pytest.mark.parametrize("steps", [2.0, 3.0, 2, 3])
def test_integral_float_growth_steps_are_accepted(cls, steps):
    opt = cls(keras.optimizers.SGD(1.0), initial_scale=4.0,
              dynamic_growth_steps=steps)
    variable = keras.Variable([1.0])
    for _ in range(int(steps)):
        assert float(opt.dynamic_scale.numpy() if opt.built else 4.0) == 4.0
        opt.apply([tf.constant([4.0])], [variable])
    assert float(opt.dynamic_scale.numpy()) == 8.0
    assert opt.dynamic_growth_steps == steps
    if cls is tf_lossscale.LossScaleOptimizer:  # an int, as tf_keras keeps
        assert type(opt.dynamic_growth_steps) is int


@CLASSES
def test_unknown_arguments_raise_value_error_listing_them_in_order(cls):
    with pytest.raises(ValueError, match="arguments: `foo`, `bar`"):
        cls(keras.optimizers.SGD(), foo=1, bar=2)


BASE_ARGUMENTS = {  # a value away from the default, per argument
    "weight_decay": 0.1, "clipnorm": 1.0, "global_clipnorm": 1.0,
    "clipvalue": 1.0, "use_ema": True, "ema_momentum": 0.5,
    "ema_overwrite_frequency": 3, "loss_scale_factor": 2.0,
    "gradient_accumulation_steps": 2,
}


@CLASSES
@pytest.mark.parametrize("argument", sorted(BASE_ARGUMENTS))
def test_base_optimizer_argument_on_the_wrapper_raises_value_error(
        cls, argument):
    with pytest.raises(ValueError, match=f"does not support `{argument}`. "
                       f"Instead, set `{argument}` on the `inner_optimizer`"):
        cls(keras.optimizers.SGD(), **{argument: BASE_ARGUMENTS[argument]})


@CLASSES
def test_base_optimizer_arguments_at_their_defaults_are_accepted(cls):
    opt = cls(keras.optimizers.SGD(), weight_decay=None, clipnorm=None,
              global_clipnorm=None, clipvalue=None, use_ema=False,
              ema_momentum=0.99, ema_overwrite_frequency=None,
              loss_scale_factor=None, gradient_accumulation_steps=None)
    assert opt.initial_scale == 2.0**15


def _sgd_step_pair(make_inner, grads_values, initial_scale=4.0,
                   variable_values=(1.0, 2.0), keep_gradient=False):
    """One `apply` with scaled gradients on ours and on Keras'."""
    results = []
    for cls in (tf_lossscale.LossScaleOptimizer, KERAS_LSO):
        inner = make_inner()
        opt = cls(inner, initial_scale=initial_scale)
        variable = keras.Variable(list(variable_values))
        if keep_gradient:
            variable.overwrite_with_gradient = True
        opt.apply([tf.constant(grads_values, tf.float32)], [variable])
        results.append((opt, inner, variable.numpy()))
    return results


def test_inner_with_loss_scale_factor_is_accepted_and_neutralized():
    (ours, our_inner, ours_w), (theirs, their_inner, theirs_w) = (
        _sgd_step_pair(lambda: keras.optimizers.SGD(
            1.0, loss_scale_factor=100.0), [8.0, 4.0]))
    assert our_inner.loss_scale_factor is None
    assert their_inner.loss_scale_factor is None
    # Unscaled by 4 once (not by 100 again): [1, 2] - [2, 1].
    np.testing.assert_array_equal(ours_w, [-1.0, 1.0])
    np.testing.assert_array_equal(ours_w, theirs_w)


def test_overwrite_with_gradient_variable_gets_the_gradient_as_is():
    (ours, _, ours_w), (_, _, theirs_w) = _sgd_step_pair(
        lambda: keras.optimizers.SGD(1.0), [8.0, 12.0], keep_gradient=True)
    np.testing.assert_array_equal(ours_w, [8.0, 12.0])
    np.testing.assert_array_equal(ours_w, theirs_w)
    assert float(ours.dynamic_scale.numpy()) == 4.0


def test_overwrite_with_gradient_non_finite_value_skips_on_both():
    pair = _sgd_step_pair(lambda: keras.optimizers.SGD(1.0), [NAN, 12.0],
                          keep_gradient=True)
    for opt, _, values in pair:
        np.testing.assert_array_equal(values, [1.0, 2.0])
        assert float(opt.dynamic_scale.numpy()) == 2.0


@CLASSES
def test_apply_without_variables_after_build_uses_the_built_ones(cls):
    opt = cls(keras.optimizers.SGD(1.0), initial_scale=4.0)
    variable = keras.Variable([1.0, 2.0])
    opt.build([variable])
    assert opt.apply([tf.constant([4.0, 4.0])]) is None
    np.testing.assert_array_equal(variable.numpy(), [0.0, 1.0])
    assert int(opt.iterations.numpy()) == 1


def test_apply_without_variables_before_build_raises_the_same_type():
    raised = []
    for cls in (tf_lossscale.LossScaleOptimizer, KERAS_LSO):
        opt = cls(keras.optimizers.SGD(1.0))
        with pytest.raises(Exception) as info:
            opt.apply([tf.constant([4.0, 4.0])])
        raised.append(info.type)
    assert raised[1] is TypeError
    assert issubclass(raised[0], raised[1]), raised


@pytest.mark.parametrize("clip", [
    {"clipnorm": 1.0}, {"global_clipnorm": 1.0}, {"clipvalue": 0.5}],
    ids=["clipnorm", "global_clipnorm", "clipvalue"])
def test_inner_clipping_acts_on_unscaled_gradients_and_inf_is_skipped(clip):
    expected = {"clipnorm": [-0.6, -0.8], "global_clipnorm": [-0.6, -0.8],
                "clipvalue": [-0.5, -0.5]}[next(iter(clip))]
    finals = []
    for cls in (tf_lossscale.LossScaleOptimizer, KERAS_LSO):
        opt = cls(keras.optimizers.SGD(1.0, **clip), initial_scale=4.0)
        variable = keras.Variable([0.0, 0.0])
        # Scaled [12, 16]: unscaled [3, 4], norm 5, then clipped.
        opt.apply([tf.constant([12.0, 16.0])], [variable])
        np.testing.assert_allclose(variable.numpy(), expected, rtol=1e-6)
        # An Inf is skipped, not clipped to a finite step.
        opt.apply([tf.constant([INF, 16.0])], [variable])
        np.testing.assert_allclose(variable.numpy(), expected, rtol=1e-6)
        assert float(opt.dynamic_scale.numpy()) == 2.0
        finals.append(variable.numpy())
    np.testing.assert_array_equal(*finals)


def test_clipping_set_through_the_wrapper_reaches_the_inner_only_on_ours():
    # Deliberate difference (docs/differences.md): hyperparameters read and
    # write through; on Keras' class `clipnorm` is the wrapper's own.
    ours = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(1.0, clipnorm=1.0), initial_scale=4.0)
    theirs = KERAS_LSO(keras.optimizers.SGD(1.0, clipnorm=1.0),
                       initial_scale=4.0)
    for opt in (ours, theirs):
        opt.clipnorm = 2.0
    assert ours.inner_optimizer.clipnorm == 2.0
    assert theirs.inner_optimizer.clipnorm == 1.0
    variable = keras.Variable([0.0, 0.0])
    ours.apply([tf.constant([12.0, 16.0])], [variable])
    np.testing.assert_allclose(variable.numpy(), [-1.2, -1.6], rtol=1e-6)


@CLASSES
def test_iterations_has_no_setter_as_on_keras(cls):
    # TK/T24 set `iterations` on tf_keras' wrapper; Keras 3's property is
    # read-only, and the Keras 3 flavour follows Keras 3.
    opt = cls(keras.optimizers.SGD())
    with pytest.raises(AttributeError):
        opt.iterations = keras.Variable(3, dtype="int64")


def test_setting_loss_scale_raises_attribute_error_on_ours():
    # `loss_scale` is TensorFlow's documented read-only attribute, which the
    # Keras 3 flavour has (docs/differences.md); Keras' class has no such
    # attribute, so there it is a plain assignment.
    ours = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD())
    with pytest.raises(AttributeError):
        ours.loss_scale = 2.0
    assert float(ours.loss_scale) == 2.0**15
    theirs = KERAS_LSO(keras.optimizers.SGD())
    theirs.loss_scale = 2.0
    assert theirs.loss_scale == 2.0


class _Delegating(keras.optimizers.Optimizer):
    """An optimizer that wraps another and delegates its learning rate."""

    def __init__(self, inner, **kwargs):
        super().__init__(learning_rate=0.0, name="delegating", **kwargs)
        self._wrapped = inner

    @property
    def learning_rate(self):
        return self._wrapped.learning_rate

    @learning_rate.setter
    def learning_rate(self, value):
        if hasattr(self, "_wrapped"):
            self._wrapped.learning_rate = value

    def build(self, variables):
        self._wrapped.build(variables)
        super().build(variables)

    def apply(self, grads, trainable_variables=None):
        self._wrapped.apply(grads, trainable_variables)


@CLASSES
def test_learning_rate_delegates_through_a_wrapping_inner_optimizer(cls):
    sgd = keras.optimizers.SGD(0.5)
    opt = cls(_Delegating(sgd))
    assert float(opt.learning_rate.numpy()) == 0.5
    opt.learning_rate = 0.25
    assert float(sgd.learning_rate.numpy()) == 0.25
    variable = keras.Variable([1.0])
    opt.apply([tf.constant([4.0 * 2.0**15])], [variable])
    np.testing.assert_array_equal(variable.numpy(), [0.0])


@keras.saving.register_keras_serializable(package="differential")
class _RegisteredSGD(keras.optimizers.SGD):
    pass


class _CustomSGD(keras.optimizers.SGD):
    """Not registered: found only through `custom_objects`."""


@CLASSES
def test_custom_inner_optimizer_round_trips_with_custom_objects(cls):
    opt = cls(_CustomSGD(0.5, name="inner"), initial_scale=8.0,
              dynamic_growth_steps=3, name="lso")
    config = keras.optimizers.serialize(opt)
    restored = keras.optimizers.deserialize(
        config, custom_objects={"_CustomSGD": _CustomSGD})
    assert type(restored) is type(opt)
    assert type(restored.inner_optimizer) is _CustomSGD
    assert restored.get_config() == opt.get_config()
    assert (restored.initial_scale, restored.dynamic_growth_steps) == (8.0, 3)


def test_custom_inner_configs_are_equal_on_both_classes():
    configs = [cls(_CustomSGD(0.5, name="inner"), initial_scale=8.0,
                   dynamic_growth_steps=3, name="lso").get_config()
               for cls in (tf_lossscale.LossScaleOptimizer, KERAS_LSO)]
    assert configs[0] == {**configs[1], "dynamic": True}


def test_central_storage_strategy_is_refused_at_construction_and_step():
    # Keras' own class takes it and fails inside its first step (a
    # ValueError from a cond in cross-replica context); ours refuses it up
    # front, as tf_keras' does.
    strategy = tf.distribute.experimental.CentralStorageStrategy(
        ["/cpu:0", "/cpu:1"])
    with strategy.scope():
        with pytest.raises(ValueError, match="CentralStorageStrategy"):
            tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD())
    # Made outside it, ours refuses a step under it (TK/T24: `minimize`).
    ours = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(1.0))
    variable = tf.Variable([1.0])
    with strategy.scope():
        with pytest.raises(ValueError, match="CentralStorageStrategy"):
            ours.minimize(lambda: tf.reduce_sum(variable), [variable])
    np.testing.assert_array_equal(variable.numpy(), [1.0])


def test_experimental_class_refuses_a_loss_scale_of_another_class():
    class Halving(tf_lossscale.LossScale):
        def __call__(self):
            return tf.constant(2.0)

        def update(self, grads):
            return None, True

        def get_config(self):
            return {}

    with pytest.raises(TypeError):
        tf_lossscale.experimental.LossScaleOptimizer(
            keras.optimizers.SGD(), loss_scale=Halving())


class _SpySGD(keras.optimizers.SGD):
    """Records what reaches the inner optimizer's `apply`."""

    seen = []

    def apply(self, grads, trainable_variables=None):
        _SpySGD.seen.extend(type(g) for g in grads)
        return super().apply(grads, trainable_variables)


def _mirrored_step(strategy, opt, variable):
    @tf.function
    def step(bad):
        def replica_fn():
            with tf.GradientTape() as tape:
                loss = opt.scale_loss(tf.reduce_sum(variable * bad))
            opt.apply(tape.gradient(loss, [variable]), [variable])
        strategy.run(replica_fn)
    return step


def test_mirrored_inner_apply_gets_plain_tensors_and_matches_keras(
        mirrored_strategy):
    """Under MirroredStrategy both hand the inner optimizer per-replica
    plain tensors, and the steps (a finite one, then one with NaN on every
    replica, where the two agree) give the same variables and scale."""
    results = []
    for cls in (tf_lossscale.LossScaleOptimizer, KERAS_LSO):
        with mirrored_strategy.scope():
            opt = cls(_SpySGD(0.5), initial_scale=4.0,
                      dynamic_growth_steps=1)
            variable = keras.Variable([1.0, 2.0])
            opt.build([variable])

        step = _mirrored_step(mirrored_strategy, opt, variable)
        _SpySGD.seen = []
        step(tf.constant(1.0))
        assert _SpySGD.seen and all(
            issubclass(t, tf.Tensor) and not issubclass(
                t, tf.distribute.DistributedValues) for t in _SpySGD.seen)
        after_finite = (variable.numpy().copy(),
                        float(opt.dynamic_scale.numpy()))
        step(tf.constant(NAN))
        results.append((after_finite, variable.numpy(),
                        float(opt.dynamic_scale.numpy())))
    ours, theirs = results
    # Two replicas each add 1 * 0.5: [1, 2] - 1.
    np.testing.assert_array_equal(ours[0][0], [0.0, 1.0])
    assert ours[0][1] == 8.0
    np.testing.assert_array_equal(ours[0][0], theirs[0][0])
    np.testing.assert_array_equal(ours[1], theirs[1])
    assert ours[2] == theirs[2] == 4.0
