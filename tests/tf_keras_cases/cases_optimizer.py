"""The tf_keras flavour: construction, attributes, steps, config, fit.

Runs under TF_USE_LEGACY_KERAS=1 (see tests/_tf_keras_cases.py). The tests
that hold on both Kerases are written once, in tests/_both_optimizer.py, and
run here on tf_keras (imported below; the `flavour` fixture is tf_keras' in
this process); this module holds what is tf_keras' own.
"""

import copy
import pathlib
import re
import warnings

import numpy as np
import pytest
import tensorflow as tf
import tf_keras
from _both_optimizer import *  # noqa: F403 (the tests on both Kerases)
from _both_optimizer import MODES, WITH_XLA
from _both_optimizer import runner as _runner
from _gradient_check import identity_checking_its_gradient

import tf_lossscale
from tf_lossscale import tf_keras_optimizer


def _lso(inner=None, **kwargs):
    inner = inner if inner is not None else tf_keras.optimizers.SGD(0.25)
    return tf_lossscale.LossScaleOptimizer(inner, **kwargs)


def _snapshot(variables):
    return [v.numpy().copy() for v in variables]


def _assert_bit_identical(before, after):
    for b, a in zip(before, after):
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


# Construction and attributes.


def test_tf_keras_inner_gives_the_visible_tf_keras_flavour():
    opt = _lso()
    assert type(opt).__name__ == "TfKerasLossScaleOptimizer"
    assert isinstance(opt, tf_lossscale.LossScaleOptimizer)
    assert isinstance(opt, tf_keras.optimizers.Optimizer)
    assert isinstance(opt, tf_keras.mixed_precision.LossScaleOptimizer)


@pytest.mark.parametrize("first", ["ours", "tf_keras"])
def test_an_inner_already_wrapped_raises_value_error(first):
    inner = tf_keras.optimizers.SGD()
    if first == "ours":
        _lso(inner)
    else:
        tf_keras.mixed_precision.LossScaleOptimizer(inner)
    with pytest.raises(ValueError, match="already wrapped"):
        _lso(inner)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"dynamic": "dynamic"}, TypeError, "dynamic must be a bool"),
    ({"initial_scale": 0}, ValueError, "initial_scale"),
    ({"dynamic_growth_steps": 0}, ValueError, "dynamic_growth_steps"),
    ({"dynamic": False}, ValueError, "initial_scale is required"),
])
def test_bad_arguments_raise_and_leave_the_inner_wrappable(kwargs, error,
                                                           match):
    inner = tf_keras.optimizers.SGD()
    with pytest.raises(error, match=match):
        _lso(inner, **kwargs)
    assert _lso(inner).inner_optimizer is inner


def test_variables_are_the_inner_ones_then_scale_and_counter():
    var = tf.Variable([1.0])
    opt = _lso(tf_keras.optimizers.SGD(momentum=0.9))
    opt.build([var])
    inner = list(opt.inner_optimizer.variables)
    assert len(inner) == 2  # iterations and the momentum slot.
    assert opt.variables == inner + [opt.dynamic_scale, opt.step_counter]
    assert opt.variables() == opt.variables  # tf_keras' callable spelling.


def test_hyperparameters_read_and_write_through_to_the_inner():
    inner = tf_keras.optimizers.SGD(0.5, momentum=0.9)
    opt = _lso(inner)
    assert float(opt.learning_rate) == 0.5 and opt.momentum == 0.9
    opt.learning_rate = 0.125
    opt.momentum = 0.5
    assert float(inner.learning_rate) == 0.125 and inner.momentum == 0.5
    opt.lr = 0.0625  # tf_keras' old spelling.
    assert float(inner.learning_rate) == 0.0625


# Steps.


def _documented_step(opt, var):
    with tf.GradientTape() as tape:
        loss = opt.get_scaled_loss(tf.reduce_sum(var * var))
    grads = opt.get_unscaled_gradients(tape.gradient(loss, [var]))
    opt.apply_gradients(zip(grads, [var]))


def _scaled_step(opt, var):
    # get_scaled_loss ran and get_unscaled_gradients did not: the
    # gradients are taken as scaled (docs/differences.md).
    with tf.GradientTape() as tape:
        loss = opt.get_scaled_loss(tf.reduce_sum(var * var))
    opt.apply_gradients(zip(tape.gradient(loss, [var]), [var]))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("flow", [_documented_step, _scaled_step],
                         ids=["documented", "scaled"])
def test_both_flows_apply_the_unscaled_gradients(mode, flow):
    var = tf.Variable([1.0, 2.0])
    opt = _lso(initial_scale=1024.0)
    _runner(mode, lambda: flow(opt, var))()
    # grad = 2 * var; SGD(0.25): var - 0.5 * var, exact in float32.
    np.testing.assert_array_equal(var.numpy(), [0.5, 1.0])
    assert (int(opt.dynamic_counter), int(opt.iterations)) == (1, 1)


def test_fixed_scale_unscales_scaled_gradients():
    var = tf.Variable([1.0, 2.0])
    opt = _lso(dynamic=False, initial_scale=8)
    _scaled_step(opt, var)
    np.testing.assert_array_equal(var.numpy(), [0.5, 1.0])


@pytest.mark.parametrize("mode", WITH_XLA)
def test_scale_and_variables_match_tf_keras_own_wrapper_step_by_step(mode):
    """Same inner, same gradients: the same scale and weights every step."""
    pattern = [1, 1, 1, np.nan, 1, 1, np.inf, 1, 1, 1, 1, np.nan, 1]
    runs = []
    for make in (tf_lossscale.LossScaleOptimizer,
                 tf_keras.mixed_precision.LossScaleOptimizer):
        var = tf.Variable([1.0, 2.0])
        opt = make(tf_keras.optimizers.SGD(0.1, momentum=0.9),
                   initial_scale=4.0, dynamic_growth_steps=2)

        def step(factor, opt=opt, var=var):
            with tf.GradientTape() as tape:
                loss = opt.get_scaled_loss(tf.reduce_sum(var * var) * factor)
            grads = opt.get_unscaled_gradients(tape.gradient(loss, [var]))
            opt.apply_gradients(zip(grads, [var]))

        step = _runner(mode, step)
        trace = []
        for factor in pattern:
            step(tf.constant(factor, tf.float32))
            trace.append((var.numpy().tolist(), float(opt.loss_scale),
                          int(opt.dynamic_counter), int(opt.iterations)))
        runs.append(trace)
    assert runs[0] == runs[1]
    assert [scale for _, scale, _, _ in runs[0]][:5] == [4.0, 8.0, 8.0, 4.0,
                                                          4.0]


def test_scale_never_falls_below_one():
    var = tf.Variable([1.0])
    opt = _lso(initial_scale=2.0)
    for _ in range(3):
        opt.apply_gradients([(tf.constant([np.nan]), var)])
    assert float(opt.loss_scale) == 1.0


def test_learning_rate_schedule_follows_iterations_across_skips():
    schedule = tf_keras.optimizers.schedules.PiecewiseConstantDecay(
        [1], [0.5, 0.25])  # 0.5 for iterations 0-1, then 0.25.
    var = tf.Variable([1.0])
    opt = _lso(tf_keras.optimizers.SGD(schedule), initial_scale=1.0)
    step = tf.function(lambda g: opt.apply_gradients([(g, var)]))
    step(tf.constant([np.nan]))  # Skipped: iterations 0 -> 1.
    step(tf.constant([1.0]))  # Iteration 1: lr 0.5.
    step(tf.constant([1.0]))  # Iteration 2: lr 0.25.
    np.testing.assert_array_equal(var.numpy(), [0.25])


# compile / fit.


def _data(n=32):
    rng = np.random.default_rng(0)
    return (rng.normal(size=(n, 3)).astype("float32"),
            rng.normal(size=(n, 1)).astype("float32"))


def _model():
    # Seeded, so a test's loss and scale are the same in every run.
    seeded = tf_keras.initializers.GlorotUniform
    return tf_keras.Sequential([
        tf_keras.layers.Dense(8, activation="relu", input_shape=(3,),
                              kernel_initializer=seeded(seed=0)),
        tf_keras.layers.Dense(1, dtype="float32",
                              kernel_initializer=seeded(seed=1))])


def test_mixed_float16_compile_keeps_it_and_fit_trains(mixed_float16):
    model = _model()
    opt = _lso(tf_keras.optimizers.Adam(0.01), initial_scale=256.0,
               dynamic_growth_steps=3)
    model.compile(optimizer=opt, loss="mse")
    assert model.optimizer is opt
    assert model.layers[0].compute_dtype == "float16"
    x, y = _data()
    history = model.fit(x, y, batch_size=8, epochs=3, shuffle=False,
                        verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < losses[0]
    # 12 finite steps: the scale doubled every 3.
    assert (int(opt.iterations), float(opt.loss_scale),
            int(opt.dynamic_counter)) == (12, 256.0 * 2**4, 0)


@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
def test_fit_skips_overflowing_steps_and_counts_every_step(mixed_float16,
                                                          jit_compile):
    model = _model()
    opt = _lso(tf_keras.optimizers.SGD(0.01), initial_scale=2.0**40)
    model.compile(optimizer=opt, loss="mse", jit_compile=jit_compile)
    x, y = _data()
    model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    # float16 gradients overflow while the scale is above ~2**16: those
    # steps are skipped and halve it; iterations count them all.
    assert int(opt.iterations) == 8
    assert float(opt.loss_scale) < 2.0**40
    assert all(np.isfinite(w).all() for w in model.get_weights())


# The deprecated class.


def test_experimental_class_wraps_tf_keras_optimizers():
    with pytest.warns(DeprecationWarning, match="tf_lossscale.LossScale"):
        opt = tf_lossscale.experimental.LossScaleOptimizer(
            tf_keras.optimizers.SGD(name="s"), 128)
    assert type(opt).__name__ == "TfKerasExperimentalLossScaleOptimizer"
    assert isinstance(opt, tf_lossscale.experimental.LossScaleOptimizer)
    assert isinstance(opt, tf_keras_optimizer.TfKerasLossScaleOptimizer)
    assert isinstance(opt, tf_keras.mixed_precision.LossScaleOptimizer)
    current = _lso(tf_keras.optimizers.SGD(name="s"), dynamic=False,
                   initial_scale=128)
    assert opt.get_config() == current.get_config()


def test_experimental_class_steps_like_the_current_one():
    var = tf.Variable([1.0, 2.0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        opt = tf_lossscale.experimental.LossScaleOptimizer(
            tf_keras.optimizers.SGD(0.25),
            tf_lossscale.DynamicLossScale(1024.0, 2))
    _documented_step(opt, var)
    opt.apply_gradients([(tf.constant([np.nan, 1.0]), var)])
    np.testing.assert_array_equal(var.numpy(), [0.5, 1.0])
    assert (float(opt.loss_scale), opt.dynamic_growth_steps) == (512.0, 2)


# Config.


def test_config_holds_the_inner_and_the_settings_and_round_trips():
    opt = _lso(tf_keras.optimizers.SGD(0.5, momentum=0.9, name="s"),
               initial_scale=64, dynamic_growth_steps=10)
    config = opt.get_config()
    assert {k: v for k, v in config.items() if k != "inner_optimizer"} == {
        "dynamic": True, "initial_scale": 64.0, "dynamic_growth_steps": 10}
    assert config["inner_optimizer"]["class_name"] == "SGD"
    for cls in (type(opt), tf_lossscale.LossScaleOptimizer):
        restored = cls.from_config(config)
        assert type(restored) is type(opt)
        assert restored.get_config() == config


def test_config_of_tf_keras_own_wrapper_loads_into_ours():
    theirs = tf_keras.mixed_precision.LossScaleOptimizer(
        tf_keras.optimizers.Adam(name="a"), initial_scale=16,
        dynamic_growth_steps=5)
    ours = tf_keras_optimizer.TfKerasLossScaleOptimizer.from_config(
        theirs.get_config())
    assert ours.get_config() == theirs.get_config()


@pytest.mark.parametrize("loss_scale, settings", [
    ("dynamic", (True, 32768.0, 2000)),
    (128, (False, 128.0, None)),
    ({"class_name": "FixedLossScale", "config": {"loss_scale_value": 4.0}},
     (False, 4.0, None)),
    ({"class_name": "DynamicLossScale",
      "config": {"initial_loss_scale": 256.0, "increment_period": 10,
                 "multiplier": 2.0}}, (True, 256.0, 10)),
])
def test_tf_2_3_config_with_loss_scale_loads(loss_scale, settings):
    inner = tf_keras.optimizers.serialize(tf_keras.optimizers.SGD(name="s"))
    opt = tf_keras_optimizer.TfKerasLossScaleOptimizer.from_config(
        {"optimizer": inner, "loss_scale": loss_scale})
    assert (opt.dynamic, opt.initial_scale,
            opt.dynamic_growth_steps) == settings
    assert opt.get_config()["inner_optimizer"] == inner


def _tf_2_3_config(**sgd):
    """A LossScaleOptimizer config as TF 2.3 wrote it (OptimizerV2 inner)."""
    return {"optimizer": {"class_name": "SGD", "config": {
        "name": "SGD", "learning_rate": 0.5, "decay": 0.0, "momentum": 0.9,
        "nesterov": False, **sgd}}, "loss_scale": {
            "class_name": "DynamicLossScale", "config": {
                "initial_loss_scale": 32768.0, "increment_period": 2000,
                "multiplier": 2.0}}}


@pytest.mark.parametrize("public", ["current", "experimental"])
@pytest.mark.parametrize("decay", [0.0, 0.01])
def test_tf_2_3_config_loads_its_inner_in_the_legacy_family_as_tf_keras_does(
        public, decay):
    """A TF 2.3 inner config (no `is_legacy_optimizer`, no `module`) is a
    legacy optimizer to tf_keras: its own deserialize builds its legacy
    wrapper around a legacy SGD and keeps `decay`. So does ours."""
    config = _tf_2_3_config(decay=decay)
    theirs = tf_keras.optimizers.deserialize(
        {"class_name": "LossScaleOptimizer", "config": copy.deepcopy(config)})
    cls = {"current": tf_lossscale.LossScaleOptimizer,
           "experimental": tf_lossscale.experimental.LossScaleOptimizer}[public]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        opt = cls.from_config(copy.deepcopy(config))
    assert isinstance(opt, cls)
    assert type(opt).__name__ == {
        "current": "TfKerasLegacyLossScaleOptimizer",
        "experimental": "TfKerasLegacyExperimentalLossScaleOptimizer"}[public]
    inner = opt.inner_optimizer
    assert type(inner) is type(theirs.inner_optimizer) is (
        tf_keras.optimizers.legacy.SGD)
    assert inner.get_config() == theirs.inner_optimizer.get_config()
    assert inner.get_config()["decay"] == decay
    assert opt.get_config() == theirs.get_config()
    assert (float(opt.lr), float(opt.momentum)) == (0.5, np.float32(0.9))
    assert (opt.dynamic, opt.initial_scale) == (True, 32768.0)


def test_the_current_family_flavour_refuses_a_tf_2_3_inner():
    """Its inner is a legacy optimizer (as tf_keras' own class of this
    family refuses one); the public class picks the legacy flavour."""
    with pytest.raises(TypeError, match="legacy"):
        tf_keras_optimizer.TfKerasLossScaleOptimizer.from_config(
            _tf_2_3_config())


def test_config_of_a_legacy_family_inner_raises_type_error():
    inner = tf_keras.optimizers.serialize(tf_keras.optimizers.legacy.SGD())
    with pytest.raises(TypeError, match="legacy"):
        tf_keras_optimizer.TfKerasLossScaleOptimizer.from_config(
            {"inner_optimizer": inner, "dynamic": True,
             "initial_scale": 2.0, "dynamic_growth_steps": 5})


# README.


def test_readme_tf_keras_example_runs_as_written(mixed_float16):
    readme = (pathlib.Path(__file__).resolve().parents[2] / "docs"
              / "keras.md")
    section = readme.read_text().split("<!-- section:tf_keras -->", 1)[1]
    section = section.split("<!-- section:", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    namespace = {}
    exec(compile(code, "docs/keras.md:tf_keras", "exec"), namespace)
    opt = namespace["opt"]
    assert type(opt).__name__ == "TfKerasLossScaleOptimizer"
    assert namespace["model"].optimizer is opt
    assert int(opt.iterations) == 9
    assert 1.0 <= float(opt.loss_scale) <= 2.0**15


@pytest.mark.parametrize("mode", MODES)
def test_unmarked_gradients_are_applied_unscaled_with_tf_keras_warning(
        mode, caplog):
    """Neither scaling method ran: as tf_keras' own wrapper, unscaled."""
    results = []
    for make in (tf_lossscale.LossScaleOptimizer,
                 tf_keras.mixed_precision.LossScaleOptimizer):
        var = tf.Variable(1.0)
        opt = make(tf_keras.optimizers.SGD(1.0))
        with caplog.at_level("WARNING"):
            _runner(mode, lambda opt=opt, var=var: opt.apply_gradients(
                [(tf.constant(1.0), var)]))()
        results.append(float(var.numpy()))
        assert "You forgot to call" in caplog.text
        caplog.clear()
    assert results == [0.0, 0.0]


def test_looking_at_unscaled_gradients_keeps_the_scaled_ones_scaled():
    """get_unscaled_gradients only to log a norm, then apply the scaled."""
    var = tf.Variable([1.0, 2.0])
    opt = _lso(initial_scale=1024.0)
    with tf.GradientTape() as tape:
        loss = opt.get_scaled_loss(tf.reduce_sum(var * var))
    grads = tape.gradient(loss, [var])
    norm = tf.linalg.global_norm(opt.get_unscaled_gradients(grads))
    opt.apply_gradients(zip(grads, [var]))
    assert float(norm) == pytest.approx(float(tf.norm([2.0, 4.0])))
    np.testing.assert_array_equal(var.numpy(), [0.5, 1.0])


# Behaviours tf_keras' own test file checks on both of its optimizer
# families, run here on ours and on tf_keras' wrapper side by side.

THEIRS = tf_keras.mixed_precision.LossScaleOptimizer
FAMILIES = {"current": tf_keras.optimizers, "legacy": tf_keras.optimizers.legacy}


def _both_classes():
    return (tf_lossscale.LossScaleOptimizer, THEIRS)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_scaled_loss_and_unscaled_gradients_equal_tf_keras(family):
    results = []
    for make in _both_classes():
        opt = make(FAMILIES[family].SGD(), dynamic=False, initial_scale=2.0)
        loss = tf.constant(5.0)
        half = tf.constant(5.0, tf.float16)
        scaled = [opt.get_scaled_loss(loss), opt.get_scaled_loss(half),
                  opt.get_scaled_loss(lambda loss=loss: loss)(),
                  opt.get_scaled_loss(lambda half=half: half)()]
        grads = opt.get_unscaled_gradients(
            [tf.constant(3.0), None, tf.constant(-4.0, tf.float16)])
        (sparse,) = opt.get_unscaled_gradients([tf.IndexedSlices(
            tf.constant([[4.0, 2.0], [8.0, 5.0]]), tf.constant([1, 3]),
            dense_shape=tf.constant([5, 2]))])
        results.append((
            [(float(s), s.dtype.name) for s in scaled],
            [None if g is None else (float(g), g.dtype.name) for g in grads],
            type(sparse).__name__, sparse.values.numpy().tolist(),
            sparse.indices.numpy().tolist()))
    assert results[0] == results[1] == (
        [(10.0, "float32"), (10.0, "float16"), (10.0, "float32"),
         (10.0, "float16")],
        [(1.5, "float32"), None, (-2.0, "float16")],
        "IndexedSlices", [[2.0, 1.0], [4.0, 2.5]], [1, 3])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("clip", ["clipnorm", "global_clipnorm", "clipvalue"])
def test_clipping_acts_on_unscaled_gradients_and_inf_is_skipped(mode, clip):
    """The current family (the legacy one: cases_legacy.py)."""
    traces = []
    for make in _both_classes():
        var = tf.Variable([5.0])
        opt = make(tf_keras.optimizers.SGD(2.0, **{clip: 2.0}),
                   initial_scale=2, dynamic_growth_steps=1)
        step = _runner(mode, lambda f, opt=opt, var=var: opt.minimize(
            lambda: var * f, var_list=[var]))
        trace = []
        for factor in (4.0, np.inf):
            step(tf.constant(factor))
            trace.append((var.numpy().tolist(), float(opt.loss_scale)))
        traces.append(trace)
    # The gradient 4 is clipped to 2: 5 - 2 * 2; then the Inf is skipped.
    assert traces[0] == traces[1] == [([1.0], 4.0), ([1.0], 2.0)]
    # Ours also writes the setting through to the inner optimizer (hyper-
    # parameters read and write through: a deliberate difference).
    var = tf.Variable([1.0])
    opt = _lso(tf_keras.optimizers.SGD(2.0, **{clip: 2.0}), initial_scale=8,
               dynamic_growth_steps=1)
    assert getattr(opt, clip) == 2.0
    setattr(opt, clip, 3.0)
    assert getattr(opt.inner_optimizer, clip) == 3.0
    _runner(mode, lambda: opt.minimize(lambda: var * 4.0, var_list=[var]))()
    assert (var.numpy().tolist(), float(opt.loss_scale)) == ([-5.0], 16.0)


def test_a_variable_learning_rate_and_ema_settings_write_through():
    results = []
    for make in _both_classes():
        inner = tf_keras.optimizers.Adam(learning_rate=1.0, beta_1=0.5,
                                         beta_2=0.9)
        opt = make(inner)
        opt.learning_rate = tf.Variable(0.005)
        assert opt.learning_rate is inner.learning_rate
        opt.use_ema = True
        opt.ema_momentum = 0.88
        results.append((float(opt.learning_rate), opt.use_ema,
                        opt.ema_momentum, inner.use_ema, inner.ema_momentum))
    assert results[0] == results[1] == (
        pytest.approx(0.005), True, 0.88, True, 0.88)


def test_learning_rate_of_an_inner_that_wraps_another_reads_through():
    """The current family (the legacy one: cases_legacy.py)."""

    class Wrapping(tf_keras.optimizers.Optimizer):
        def __init__(self):
            super().__init__("Wrapping")
            self.inner_optimizer = tf_keras.optimizers.SGD(learning_rate=1.0)

        @property
        def learning_rate(self):
            return self.inner_optimizer.learning_rate

        @learning_rate.setter
        def learning_rate(self, value):
            self.inner_optimizer.learning_rate = value

        def get_config(self):
            return {}

    for make in _both_classes():
        opt = make(Wrapping())
        assert float(opt.learning_rate) == 1.0
        opt.learning_rate = 2.0
        assert float(opt.learning_rate) == 2.0
        assert float(opt.inner_optimizer.inner_optimizer.learning_rate) == 2.0


def test_custom_inner_round_trips_with_custom_objects_as_tf_keras():
    """The current family (the legacy one: cases_legacy.py)."""

    class MySGD(tf_keras.optimizers.SGD):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.my_attribute = 123

    results = []
    for make in _both_classes():
        opt = make(MySGD(2.0, momentum=0.5), initial_scale=2.0,
                   dynamic_growth_steps=3.0)
        config = tf_keras.optimizers.serialize(opt)
        loaded = tf_keras.optimizers.deserialize(
            config, custom_objects={"MySGD": MySGD})
        assert type(loaded) is type(opt)
        assert type(loaded.inner_optimizer) is MySGD
        var = tf.Variable([5.0])
        loaded.minimize(lambda var=var: var * 2.0, [var])
        results.append((
            float(loaded.learning_rate), loaded.inner_optimizer.momentum,
            loaded.inner_optimizer.my_attribute, float(loaded.loss_scale),
            loaded.dynamic_growth_steps, loaded.get_config(),
            var.numpy().tolist(), int(loaded.dynamic_counter)))
    assert results[0] == results[1]
    assert results[0][:5] == (2.0, 0.5, 123, 2.0, 3)
    assert results[0][6:] == ([1.0], 1)


def _inner_momentum(inner, var):
    if isinstance(inner, tf_keras.optimizers.legacy.Optimizer):
        return inner.get_slot(var, "momentum")
    (slot,) = inner.momentums
    return slot


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("save_with_ls, restore_with_ls", [
    (True, True), (True, False), (False, True)],
    ids=["both", "saved_wrapped", "restored_wrapped"])
def test_checkpoints_keep_a_tracked_variable_of_the_inner_as_tf_keras(
        tmp_path, family, save_with_ls, restore_with_ls):
    """The wrapper on either side or both; the inner tracks a variable."""
    base = FAMILIES[family].SGD

    class Tracking(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.my_var = tf.Variable(0.0)
            self._track_trackable(self.my_var, "my_var")

    def build(make, wrapped):
        var = tf.Variable([2.0])
        inner = Tracking(1.0, momentum=1.0)
        opt = make(inner, initial_scale=1.0, dynamic_growth_steps=2.0) \
            if wrapped else inner
        return var, inner, opt

    def step(opt, var):
        opt.minimize(lambda: var + 1.0, var_list=[var])

    traces = []
    for make in _both_classes():
        trace = []
        var, inner, opt = build(make, save_with_ls)
        step(opt, var)
        inner.my_var.assign(1.0)
        trace.append((var.numpy().tolist(), int(opt.iterations),
                      _inner_momentum(inner, var).numpy().tolist()))
        path = tf.train.Checkpoint(optimizer=opt, var=var).save(
            str(tmp_path / f"{make.__name__}_{family}" / "ckpt"))

        var, inner, opt = build(make, restore_with_ls)
        checkpoint = tf.train.Checkpoint(optimizer=opt, var=var)
        status = checkpoint.restore(path)
        if save_with_ls:
            status.assert_existing_objects_matched()
        else:
            status.assert_nontrivial_match()
        scale = (float(opt.loss_scale), int(opt.dynamic_counter)) \
            if restore_with_ls else None
        trace.append((var.numpy().tolist(), int(opt.iterations), scale,
                      float(inner.my_var)))
        step(opt, var)
        momentum = _inner_momentum(inner, var)
        trace.append((var.numpy().tolist(), int(opt.iterations),
                      momentum.numpy().tolist(), float(inner.my_var)))
        status = checkpoint.restore(path)  # Now that the slots exist.
        if save_with_ls and restore_with_ls:
            status.assert_consumed()
        elif save_with_ls:
            status.assert_existing_objects_matched()
        else:
            status.assert_nontrivial_match()
        trace.append((var.numpy().tolist(), momentum.numpy().tolist()))
        traces.append(trace)
    assert traces[0] == traces[1]
    # m = m - 1 * grad; var += m: 2 -> 1, then (restored) 1 -> -1.
    counter = 1 if save_with_ls else 0
    assert traces[0] == [
        ([1.0], 1, [-1.0]),
        ([1.0], 1, (1.0, counter) if restore_with_ls else None, 1.0),
        ([-1.0], 2, [-2.0], 1.0),
        ([1.0], [-1.0])]


def _tf_keras_deserialize(config):
    """tf_keras' own reading of a LossScaleOptimizer config."""
    return tf_keras.optimizers.deserialize(
        {"class_name": "LossScaleOptimizer", "config": copy.deepcopy(config)})


def _tf_2_3_sgd_config(loss_scale):
    return {"optimizer": {"class_name": "SGD", "config": {
        "learning_rate": 2.0, "momentum": 0.5, "decay": 0.0,
        "nesterov": False, "name": "SGD"}}, "loss_scale": loss_scale}


@pytest.mark.parametrize("public", ["current", "experimental"])
@pytest.mark.parametrize("loss_scale, dynamic", [
    ({"class_name": "FixedLossScale", "config": {"loss_scale_value": 2.0}},
     False),
    ({"class_name": "DynamicLossScale", "config": {
        "initial_loss_scale": 2.0, "increment_period": 3,
        "multiplier": 2.0}}, True),
], ids=["fixed", "dynamic"])
def test_a_tf_2_3_config_gives_a_working_optimizer_as_in_tf_keras(
        public, loss_scale, dynamic):
    config = _tf_2_3_sgd_config(loss_scale)
    theirs = _tf_keras_deserialize(config)
    cls = {"current": tf_lossscale.LossScaleOptimizer,
           "experimental": tf_lossscale.experimental.LossScaleOptimizer}[public]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        ours = cls.from_config(copy.deepcopy(config))
    results = []
    for opt in (ours, theirs):
        var = tf.Variable([5.0])
        calls = []
        check = identity_checking_its_gradient(2.0, calls)
        attributes = (float(opt.learning_rate),
                      float(opt.inner_optimizer.learning_rate),
                      float(opt.inner_optimizer.momentum),
                      float(opt.loss_scale), opt.initial_scale,
                      opt.dynamic_growth_steps, opt.dynamic)
        opt.minimize(lambda var=var, check=check: check(var), [var])
        assert calls  # The loss was scaled by 2: the check ran and held.
        results.append((attributes, var.numpy().tolist(), None if (
            opt.dynamic_counter is None) else int(opt.dynamic_counter)))
    assert results[0] == results[1] == (
        (2.0, 2.0, 0.5, 2.0, 2.0, 3 if dynamic else None, dynamic),
        [3.0], 1 if dynamic else None)


def test_a_tf_2_3_config_with_multiplier_4_raises_value_error():
    config = _tf_2_3_sgd_config({"class_name": "DynamicLossScale", "config": {
        "initial_loss_scale": 2.0, "increment_period": 3, "multiplier": 4.0}})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(ValueError, match="multiplier"):
            _tf_keras_deserialize(config)
        for cls in (tf_lossscale.LossScaleOptimizer,
                    tf_lossscale.experimental.LossScaleOptimizer):
            with pytest.raises(ValueError, match="multiplier"):
                cls.from_config(copy.deepcopy(config))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_summed_gradients_of_one_replica_reuse_the_unscaled_verdict(
        monkeypatch, family):
    """tf_keras sums a replica's gradients with an IdentityN before the
    step: with one replica the step reuses get_unscaled_gradients' verdict
    (no second check); a NaN step is still skipped, a finite one applied."""
    from tf_lossscale import finite
    checks = []
    real = finite.check  # What a step calls to check unscaled gradients.
    monkeypatch.setattr(finite, "check",
                        lambda g, mode: checks.append(1) or real(g, mode))
    var = tf.Variable([1.0, 2.0])
    opt = _lso(FAMILIES[family].SGD(0.25), initial_scale=1024.0)

    @tf.function
    def step(poison):
        loss = lambda: tf.reduce_sum(var * var) * tf.where(  # noqa: E731
            poison, np.nan, 1.0)
        opt.minimize(loss, [var])

    step(tf.constant(False))
    np.testing.assert_array_equal(var.numpy(), [0.5, 1.0])
    step(tf.constant(True))
    np.testing.assert_array_equal(var.numpy(), [0.5, 1.0])
    assert (float(opt.loss_scale), int(opt.dynamic_counter)) == (512.0, 0)
    assert checks == []


def test_building_first_or_not_traces_once_and_trains_the_same():
    # tf_keras builds the optimizer inside the first trace of its train
    # function; ours makes its slots there eagerly (eager_variables.py), so
    # that trace is the only one, as when `build` came after `compile`.
    x = np.arange(8, dtype="float32").reshape(2, 4) / 8
    y = np.ones((2, 4), "float32")
    models = []
    for built in (False, True):
        tf_keras.utils.set_random_seed(1)
        model = tf_keras.Sequential([tf_keras.Input((4,)),
                                     tf_keras.layers.Dense(4)])
        model.compile(optimizer=_lso(tf_keras.optimizers.Adam(0.1)),
                      loss="mse")
        if built:
            model.optimizer.build(model.trainable_variables)
        for _ in range(3):
            model.train_on_batch(x, y)
        models.append(model)
    as_is, built = models
    assert as_is.train_function.experimental_get_tracing_count() == 1
    assert built.train_function.experimental_get_tracing_count() == 1
    for a, b in zip(as_is.trainable_variables, built.trainable_variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert [v.numpy().tolist() for v in built.optimizer.variables] == [
        v.numpy().tolist() for v in as_is.optimizer.variables]
    assert int(built.optimizer.iterations) == 3
