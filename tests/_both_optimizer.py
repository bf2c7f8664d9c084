"""The LossScaleOptimizer's construction and steps, on both Kerases.

Written once and run on each flavour (`tests/_flavours.py`):
`tests/test_keras_optimizer.py` runs them on Keras 3,
`tf_keras_cases/cases_optimizer.py` on tf_keras, each in its own process.
Gradients are written as their true (unscaled) values; `flavour.hand` turns
them into what the flavour's `apply_gradients` takes (Keras 3: scaled;
tf_keras: as they are). Where the two files had checked one behaviour with
different numbers, both sets of numbers are cases here, on both flavours.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict

import numpy as np
import pytest
import tensorflow as tf

MODES = ["eager", "function"]
# "xla": the step compiled whole (`jit_compile=True`), where the check, the
# unscale and the apply-or-skip take their XLA shapes.
WITH_XLA = MODES + ["xla"]


def runner(mode: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    if mode == "xla":
        return tf.function(fn, jit_compile=True)
    return tf.function(fn) if mode == "function" else fn


def snapshot(variables: Any) -> list:
    """Bytes of every variable: equal snapshots are bit-identical."""
    return [np.asarray(v).tobytes() for v in variables]


# Construction, defaults, attributes.


def test_defaults_are_dynamic_with_2_to_the_15_and_2000_steps(flavour):
    inner = flavour.optimizers.SGD()
    opt = flavour.wrap(inner)
    assert type(opt).__name__ == flavour.class_name
    assert opt.dynamic is True
    assert opt.initial_scale == 32768.0
    assert opt.dynamic_growth_steps == 2000
    assert opt.inner_optimizer is inner
    assert opt.loss_scale.dtype == tf.float32
    assert float(opt.loss_scale) == 32768.0
    assert int(opt.dynamic_counter) == 0


@pytest.mark.parametrize("scale", [8, 128])
def test_fixed_scale_has_no_counter_and_no_scale_variable(flavour, scale):
    opt = flavour.wrap(flavour.optimizers.SGD(), dynamic=False,
                       initial_scale=scale)
    assert opt.dynamic is False
    assert opt.initial_scale == float(scale)
    assert opt.dynamic_growth_steps is None
    assert opt.dynamic_counter is None
    assert float(opt.loss_scale) == float(scale)
    names = [v.name for v in opt.variables]
    assert "dynamic_scale" not in names and "step_counter" not in names
    # The inner's variables, after (on Keras 3) the two every Keras 3
    # optimizer has of its own, `iteration` and `learning_rate`.
    own = FIXED_SCALE_OWN_VARIABLES[flavour.name]
    assert [v.name for v in opt.variables[:len(own)]] == own
    assert opt.variables[len(own):] == list(opt.inner_optimizer.variables)


FIXED_SCALE_OWN_VARIABLES = {"keras3": ["iteration", "learning_rate"],
                             "tf_keras": []}


# Errors.


@pytest.mark.parametrize(
    "inner", ["sgd", None, tf.Module(), 0.1, tf.Variable(1.0)],
    ids=["string", "none", "module", "number", "variable"])
def test_non_optimizer_inner_raises_type_error_naming_it(flavour, inner):
    with pytest.raises(TypeError, match=flavour.optimizer_kind) as e:
        flavour.wrap(inner)
    assert repr(inner) in str(e.value)


@pytest.mark.parametrize("wrap", ["ours", "original"])
def test_wrapping_a_loss_scale_optimizer_raises_type_error(flavour, wrap):
    kind = type(flavour.wrap(flavour.optimizers.SGD()))
    inner = flavour.optimizers.SGD()
    if wrap == "ours":
        wrapped = flavour.wrap(inner)
    else:
        wrapped = flavour.original(inner)
    with pytest.raises(TypeError, match="cannot wrap another"):
        flavour.wrap(wrapped)
    with pytest.raises(TypeError, match="cannot wrap another"):
        kind(wrapped)


# Steps.


# A finite step of `finite`, then each of `bads` (true gradients) in turn.
NON_FINITE_CASES: Dict[str, Dict[str, Any]] = {
    "nan": dict(start=[1.0, 2.0, 3.0], scale=16.0, finite=[1.0, 2.0, 3.0],
                bads=[[1.0, np.nan, 3.0]], after=8.0),
    "inf": dict(start=[1.0, 2.0, 3.0], scale=16.0, finite=[1.0, 2.0, 3.0],
                bads=[[1.0, np.inf, 3.0]], after=8.0),
    "minus_inf": dict(start=[1.0, 2.0, 3.0], scale=16.0,
                      finite=[1.0, 2.0, 3.0], bads=[[1.0, -np.inf, 3.0]],
                      after=8.0),
    "nan_then_inf": dict(start=[1.0, 2.0], scale=64.0,
                         finite=[64.0, -192.0],
                         bads=[[1.0, np.nan], [1.0, np.inf]], after=16.0),
}


@pytest.mark.parametrize("mode, case", [
    (mode, case) for mode in WITH_XLA for case in NON_FINITE_CASES
    # Under XLA, one compile per case: the ones with NaN here, +-Inf in the
    # long runs of test_fault_injection.py.
    if mode != "xla" or "nan" in case])
@pytest.mark.parametrize("inner", ["sgd_momentum", "adam"])
def test_non_finite_step_changes_no_variable_and_no_slot(flavour, mode,
                                                         inner, case):
    c = NON_FINITE_CASES[case]
    var = flavour.variable(c["start"])
    make_inner = {
        "sgd_momentum": lambda: flavour.optimizers.SGD(0.1, momentum=0.9),
        "adam": lambda: flavour.optimizers.Adam(0.1)}[inner]
    opt = flavour.wrap(make_inner(), initial_scale=c["scale"],
                       dynamic_growth_steps=100)
    step = runner(mode, lambda g: opt.apply_gradients(
        [(flavour.hand(opt, g), var)]))
    step(tf.constant(c["finite"]))  # A finite step fills the slots.
    before = snapshot([var] + flavour.slots(opt))
    for bad in c["bads"]:
        step(tf.constant(bad))
    assert snapshot([var] + flavour.slots(opt)) == before
    # Advanced on the skipped steps too.
    assert int(opt.iterations) == 1 + len(c["bads"])
    assert float(opt.loss_scale) == c["after"]
    assert int(opt.dynamic_counter) == 0


@pytest.mark.parametrize("learning_rate, grad", [(0.0, 2.0**-127),
                                                 (0.25, 1.0)])
def test_scale_never_grows_to_a_non_finite_value(flavour, learning_rate,
                                                 grad):
    var = flavour.variable([1.0])
    opt = flavour.wrap(flavour.optimizers.SGD(learning_rate),
                       initial_scale=2.0**127, dynamic_growth_steps=1)
    for _ in range(3):
        opt.apply_gradients([(flavour.hand(opt, tf.constant([grad])), var)])
        assert float(opt.loss_scale) == 2.0**127
        assert int(opt.dynamic_counter) == 0


# The rows of a table, SGD on them, the scale, the steps (true row
# gradients), and the table and the scale after them.
SPARSE_CASES: Dict[str, Dict[str, Any]] = {
    "inf_on_the_row_just_moved": dict(
        table=[[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]], learning_rate=1.0,
        scale=2.0, steps=[([[1.0, 2.0]], 1), ([[np.inf, 2.0]], 1)],
        after=[[1, 1], [1, 0], [3, 3]], after_scale=1.0),
    "nan_on_another_row": dict(
        table=np.ones([4, 2]).tolist(), learning_rate=0.5, scale=4.0,
        steps=[([[1.0, 2.0]], 1), ([[np.nan, 4.0]], 2)],
        after=[[1, 1], [0.5, 0], [1, 1], [1, 1]], after_scale=2.0),
}


@pytest.mark.parametrize("case", sorted(SPARSE_CASES))
@pytest.mark.parametrize("mode", MODES)
def test_sparse_gradients_are_applied_and_checked(flavour, mode, case):
    c = SPARSE_CASES[case]
    table = flavour.variable(c["table"])
    opt = flavour.wrap(flavour.optimizers.SGD(c["learning_rate"]),
                       initial_scale=c["scale"])
    shape = tf.constant(np.shape(c["table"]))

    def step(values, row):
        grad = tf.IndexedSlices(values, tf.reshape(row, [1]), shape)
        opt.apply_gradients([(flavour.hand(opt, grad), table)])

    step = runner(mode, step)
    for values, row in c["steps"]:  # Applied, then skipped.
        step(tf.constant(values), tf.constant(row))
        np.testing.assert_array_equal(np.asarray(table), c["after"])
    assert float(opt.loss_scale) == c["after_scale"]
    assert int(opt.iterations) == 2


@pytest.mark.parametrize("dynamic", [True, False])
def test_all_none_gradients_raise_and_change_nothing(flavour, dynamic):
    for family in flavour.optimizer_families:
        var = flavour.variable([1.0])
        opt = flavour.wrap(family.SGD(), dynamic=dynamic, initial_scale=2)
        with pytest.raises(ValueError, match="No gradients"):
            opt.apply_gradients([(None, var)])
        assert int(opt.iterations) == 0
        assert float(opt.loss_scale) == 2.0
        if dynamic:
            assert int(opt.dynamic_counter) == 0


@pytest.mark.parametrize("mode", MODES)
def test_minimize_scales_unscales_and_applies(flavour, mode):
    # A callable loss: d(sum(var**2)) = 2 * var.
    var = flavour.variable([1.0, 2.0])
    opt = flavour.wrap(flavour.optimizers.SGD(0.25), initial_scale=1024.0)
    runner(mode, lambda: opt.minimize(
        lambda: tf.reduce_sum(var * var), [var]))()
    np.testing.assert_array_equal(np.asarray(var), [0.5, 1.0])
    assert int(opt.iterations) == 1

    # A callable, then a loss tensor with its tape, at a scale of 2**20.
    var = flavour.variable([1.0, 1.0])
    opt = flavour.wrap(flavour.optimizers.SGD(1.0), initial_scale=2.0**20)

    def step():
        opt.minimize(lambda: tf.reduce_sum(tf.constant([1.0, 3.0]) * var),
                     [var])
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.constant([1.0, 3.0]) * var)
        opt.minimize(loss, [var], tape=tape)

    runner(mode, step)()
    np.testing.assert_array_equal(np.asarray(var), [-1.0, -5.0])
    assert int(opt.iterations) == 2


# The first trace.


def _fit_three_steps(flavour: Any, wrap: Callable[[Any], Any],
                     inner: Callable[[], Any], jit_compile: bool) -> Any:
    """A seeded two-layer model trained three `train_on_batch` steps,
    counting the traces of its `train_step`."""
    keras = flavour.keras
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((4,)),
                              keras.layers.Dense(3, name="first"),
                              keras.layers.Dense(2, name="second")],
                             name="net")
    model.compile(optimizer=wrap(inner()), loss="mse",
                  jit_compile=jit_compile)
    traced = model.train_step
    model.traces = 0

    def counted(data: Any) -> Any:
        model.traces += 1
        return traced(data)

    model.train_step = counted
    x = np.linspace(-1, 1, 8, dtype="float32").reshape(2, 4)
    for _ in range(3):
        model.train_on_batch(x, np.ones((2, 2), "float32"))
    return model


@pytest.mark.parametrize("jit_compile", [False, True])
@pytest.mark.parametrize("optimizer", ["SGD", "Adam"])
def test_fit_traces_its_step_once_and_trains_as_the_original(
        flavour, optimizer, jit_compile):
    # The inner optimizer's slots are made eagerly (eager_variables.py):
    # the original's first step makes them in the trace, and TensorFlow
    # traces the step a second time; the trained values are the same.
    for family in flavour.optimizer_families:
        inner = functools.partial(getattr(family, optimizer), 0.1)
        ours = _fit_three_steps(flavour, flavour.wrap, inner, jit_compile)
        theirs = _fit_three_steps(flavour, flavour.original, inner,
                                  jit_compile)
        assert ours.traces == 1, family.__name__
        _assert_same(ours.trainable_variables, theirs.trainable_variables,
                     jit_compile)
        _assert_same(_variables(ours.optimizer.inner_optimizer),
                     _variables(theirs.optimizer.inner_optimizer),
                     jit_compile)
        assert int(ours.optimizer.iterations) == 3


def _assert_same(mine: Any, theirs: Any, compiled: bool) -> None:
    """Bit-identical; compiled by XLA, equal to float32 rounding (how XLA
    fuses an update may round one element's last bit differently)."""
    if not compiled:
        assert snapshot(mine) == snapshot(theirs)
        return
    assert len(mine) == len(theirs)
    for a, b in zip(mine, theirs):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6,
                                   atol=1e-7)


def _loop_traced_once(flavour: Any, family: Any, jit_compile: bool) -> None:
    """Two steps of a custom loop's `tf.function` with Adam: one trace,
    and the values of the inner optimizer alone."""
    var = flavour.variable([1.0, -2.0])
    opt = flavour.wrap(family.Adam(0.5), initial_scale=4.0)
    step = tf.function(
        lambda: flavour.scaled_step(
            opt, lambda: tf.reduce_sum(var * var), [var]),
        jit_compile=jit_compile)
    step()
    step()
    assert step.experimental_get_tracing_count() == 1, family.__name__
    assert int(opt.iterations) == 2
    # The inner optimizer alone, eagerly, on the true gradients 2 * var
    # (XLA fuses Adam's update: equal to float32 rounding).
    alone, plain = flavour.variable([1.0, -2.0]), family.Adam(0.5)
    for _ in range(2):
        plain.apply_gradients([(2 * tf.convert_to_tensor(alone), alone)])
    np.testing.assert_allclose(np.asarray(var), np.asarray(alone), rtol=1e-6)
    for mine, other in zip(_variables(opt.inner_optimizer),
                           _variables(plain)):
        np.testing.assert_allclose(np.asarray(mine), np.asarray(other),
                                   rtol=1e-6)


@pytest.mark.parametrize("mode", ["function", "xla"])
def test_a_custom_loop_step_is_traced_once(flavour, mode):
    for family in flavour.optimizer_families:
        _loop_traced_once(flavour, family, mode == "xla")


def _variables(optimizer: Any) -> list:
    """An optimizer's variables (tf_keras' legacy ones: a method)."""
    found = optimizer.variables
    return list(found() if callable(found) else found)


# What a module of each side imports to run the tests above.
__all__ = [name for name in dir() if name.startswith("test_")]
