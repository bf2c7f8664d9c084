"""Differential fuzz of bad and edge inputs: ours against each original.

Three of the four pairs run here (the tf_keras one runs in a process of its
own, `tf_keras_cases/cases_differential_bad_input.py`):

- loss scales: `tf_lossscale.{FixedLossScale, DynamicLossScale, get,
  serialize, deserialize}` and `update` against `tf.compat.v1.
  mixed_precision.*` and TensorFlow's private Keras `loss_scale` module
  (which holds the `get` / `serialize` / `deserialize` that TF 2.4's
  `Policy` calls);
- the Keras 3 flavour against `keras.mixed_precision.LossScaleOptimizer`:
  construction, a step with edge gradients, `scale_loss`;
- the TF1 `MixedPrecisionLossScaleOptimizer` against TensorFlow's, in a
  `tf.compat.v1.Graph`.

hypothesis draws every argument from a pool of edge values (bools, zero,
negatives, NaN, inf, huge, fractional, strings, NumPy scalars and arrays,
tensors, None, containers). Each case runs on both sides and must give an
equal result, the same exception type, or a difference listed in
`_bad_input_differences.DELIBERATE` with its reason. The totals per pair
print at the end of the module (`pytest -s`) and go to
`$BAD_INPUT_FUZZ_TOTALS` when it names a file.
"""

from __future__ import annotations

import os
import time

import keras
import numpy as np
import pytest
import tensorflow as tf
from _bad_input_differences import (
    Outcome,
    Tally,
    judge,
    outcome,
    plain,
    used_rows,
)
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tensorflow.python.keras.mixed_precision import loss_scale as tf_keras_ls

import tf_lossscale

TF = tf.compat.v1.mixed_precision
NAN, INF = float("nan"), float("inf")

FUZZ = settings(
    max_examples=int(os.environ.get("BAD_INPUT_FUZZ_EXAMPLES", "45")),
    deadline=None, derandomize=True, database=None,
    suppress_health_check=[HealthCheck.too_slow,
                           HealthCheck.function_scoped_fixture])

# The cases that build a model, trace a function or a graph: fewer.
FUZZ_FEW = settings(FUZZ, max_examples=max(1, FUZZ.max_examples // 3))

# Edge values for a number argument, made lazily (tensors need TF ready).
NUMBERS = st.sampled_from([
    "None", "True", "False", "0", "1", "-1", "0.5", "1.0", "2", "2.0", "2.5",
    "3", "1024", "2**15", "1e40", "inf", "-inf", "nan", "'1024'", "'dynamic'",
    "np.float32(8)", "np.int64(3)", "np.float16(4)", "np.array(8.0)",
    "np.array([8.0])", "tf.constant(8.0)", "tf.constant(8)",
    "tf.constant([8.0])", "tf.constant(8.0, tf.float16)", "[]", "{}",
    "2**63", "1e-50", "1 + 1e-9",
])


def make(expression: str):
    return eval(expression, {"np": np, "tf": tf, "inf": INF,  # noqa: S307
                             "nan": NAN})


TALLIES = {pair: Tally() for pair in ("loss_scale", "keras3", "v1")}
STARTED = {}


@pytest.fixture(scope="module", autouse=True)
def report_totals():
    yield
    lines = [TALLIES[p].line(p, STARTED.get(p + "_seconds", 0.0))
             for p in TALLIES]
    print("\n" + "\n".join(lines) + "\n" + used_rows(list(TALLIES)))
    path = os.environ.get("BAD_INPUT_FUZZ_TOTALS")
    if path:
        with open(path, "a") as f:
            f.write("\n".join(lines) + "\n")


def _timed(pair):
    """Adds the wall time of a test to its pair's total."""
    def decorate(test):
        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                return test(*args, **kwargs)
            finally:
                key = pair + "_seconds"
                STARTED[key] = STARTED.get(key, 0.0) + (
                    time.perf_counter() - start)
        run.__name__ = test.__name__
        run.__wrapped__ = test
        return run
    return decorate


# ---------------------------------------------------------------- loss scales

LS_ARGS = st.fixed_dictionaries({}, optional={
    "initial_loss_scale": NUMBERS, "increment_period": NUMBERS,
    "multiplier": NUMBERS})


@_timed("loss_scale")
@FUZZ
@given(args=LS_ARGS)
def test_dynamic_loss_scale_construction(args):
    case = {k: make(v) for k, v in args.items()}
    ours = outcome(lambda: _scale_state(tf_lossscale.DynamicLossScale(**case)))
    theirs = outcome(lambda: _scale_state(TF.DynamicLossScale(**case)))
    judge(TALLIES["loss_scale"], "loss_scale", "DynamicLossScale", case,
          ours, theirs)


def _scale_state(loss_scale):
    return (plain(loss_scale.get_config()), plain(loss_scale()))


@_timed("loss_scale")
@FUZZ
@given(value=NUMBERS)
def test_fixed_loss_scale_construction(value):
    case = {"loss_scale_value": make(value)}
    ours = outcome(lambda: _scale_state(tf_lossscale.FixedLossScale(**case)))
    theirs = outcome(lambda: _scale_state(TF.FixedLossScale(**case)))
    judge(TALLIES["loss_scale"], "loss_scale", "FixedLossScale", case, ours,
          theirs)


IDENTIFIERS = st.one_of(NUMBERS, st.sampled_from([
    "'Dynamic'", "'fixed'", "{'class_name': 'FixedLossScale', 'config': "
    "{'loss_scale_value': 8.0}}", "{'class_name': 'DynamicLossScale', "
    "'config': {}, 'module': 'x', 'registered_name': None}",
    "{'class_name': 'DynamicLossScale'}", "{'class_name': 'Foo', 'config': "
    "{}}", "{'class_name': 'FixedLossScale', 'config': {'x': 1}}",
    "{'config': {}}", "'FixedLossScale'", "'DynamicLossScale'", "OWN_FIXED",
    "OWN_DYNAMIC", "SIDE_FIXED",
]))


def _identifier(expression, side):
    """An identifier; OWN_* is the side's own loss scale, SIDE_* ours."""
    if expression.startswith("OWN_"):
        cls = side.FixedLossScale if expression == "OWN_FIXED" else (
            side.DynamicLossScale)
        return cls(4) if cls is side.FixedLossScale else cls(4.0)
    if expression == "SIDE_FIXED":
        return tf_lossscale.FixedLossScale(4)
    return make(expression)


@_timed("loss_scale")
@FUZZ
@given(identifier=IDENTIFIERS)
def test_get_serialize_deserialize(identifier):
    tally = TALLIES["loss_scale"]
    case = {"identifier": identifier, "side_object": identifier == (
        "SIDE_FIXED")}
    for call, ours_fn, theirs_fn in (
            ("get", tf_lossscale.get, tf_keras_ls.get),
            ("serialize", tf_lossscale.serialize, tf_keras_ls.serialize),
            ("deserialize", tf_lossscale.deserialize, tf_keras_ls.deserialize)):
        ours = outcome(lambda f=ours_fn: f(_identifier(identifier,
                                                         tf_lossscale)))
        theirs = outcome(lambda f=theirs_fn: f(_identifier(identifier, TF)))
        judge(tally, "loss_scale", call,
              {**case, "identifier": _identifier(identifier, tf_lossscale)},
              ours, theirs)


GRADIENTS = st.sampled_from([
    "[]", "None", "[None]", "tf.constant(1.0)", "[tf.constant([1.0, nan])]",
    "[tf.constant(inf, tf.float16)]", "[tf.constant([1, 2])]",
    "{'a': tf.constant(1.0), 'b': [None, tf.constant(-inf)]}",
    "[tf.IndexedSlices(tf.constant([[nan]]), tf.constant([0]))]",
    "[tf.constant(65504.0, tf.float16)]", "(tf.constant(1e38),)",
    "[tf.constant([], tf.float32)]", "[tf.constant(1.0, tf.float64)]",
])


@_timed("loss_scale")
@FUZZ_FEW  # Each case traces a tf.function per update.
@given(grads=st.lists(GRADIENTS, min_size=1, max_size=3),
       eager=st.booleans())
def test_dynamic_update(grads, eager):
    def run(cls):
        loss_scale = cls(initial_loss_scale=8.0, increment_period=2)
        results = []
        for expression in grads:
            def update(expression=expression):
                return loss_scale.update(make(expression))
            op, verdict = update() if eager else tf.function(update)()
            results.append((None if op is None else "op", plain(verdict),
                            plain(loss_scale())))
        return results
    case = {"grads": grads, "eager": eager}
    ours = outcome(lambda: run(tf_lossscale.DynamicLossScale), lambda r: r)
    theirs = outcome(lambda: run(TF.DynamicLossScale), lambda r: r)
    if eager and not ours.raised and not theirs.raised:
        # Eagerly our update_op is always None (documented); compare rest.
        ours = Outcome([r[1:] for r in ours.result])
        theirs = Outcome([r[1:] for r in theirs.result])
    judge(TALLIES["loss_scale"], "loss_scale", "update", case, ours, theirs)


# ------------------------------------------------------------ Keras 3 flavour

K3_ARGS = st.fixed_dictionaries({}, optional={
    "initial_scale": NUMBERS, "dynamic_growth_steps": NUMBERS,
    "dynamic": st.sampled_from(["True", "False", "1", "None", "'dynamic'"]),
    "positional": NUMBERS})


def _k3_construct(cls, case):
    args = [keras.optimizers.SGD(0.5)]
    kwargs = {k: v for k, v in case.items() if k != "positional"}
    if "positional" in case:
        args.append(case["positional"])
    opt = cls(*args, **kwargs)
    config = opt.get_config()
    return {"initial_scale": _as_number(config["initial_scale"]),
            "dynamic_growth_steps": _as_number(config["dynamic_growth_steps"]),
            "scale": plain(opt.scale_loss(tf.constant(1.0)))}


def _as_number(value):
    """A config number as a float, whatever object holds it."""
    try:
        return float(np.asarray(value))
    except Exception:  # noqa: BLE001 - not one: compare it as it is
        return plain(value)


@_timed("keras3")
@FUZZ
@given(args=K3_ARGS)
def test_keras3_construction(args):
    case = {k: make(v) for k, v in args.items()}
    ours = outcome(lambda: _k3_construct(tf_lossscale.LossScaleOptimizer,
                                         case), lambda r: r)
    theirs = outcome(lambda: _k3_construct(
        keras.mixed_precision.LossScaleOptimizer, case), lambda r: r)
    judge(TALLIES["keras3"], "keras3", "construct", case, ours, theirs)


DENSE_GRADS = st.sampled_from([
    "tf.constant([1.0, 2.0])", "tf.constant([nan, 1.0])",
    "tf.constant([inf, 1.0])", "tf.constant([1e38, -1e38])", "None",
    "tf.constant([1.0, 2.0], tf.float16)", "tf.constant([1, 2])",
    "tf.constant([1.0, 2.0, 3.0])", "tf.constant(1.0)",
])
TABLE_GRADS = st.sampled_from([
    "tf.constant([[1.0, 2.0], [3.0, 4.0]])", "None",
    "tf.constant([[1.0, nan], [3.0, 4.0]])", "tf.constant([1.0, 2.0])",
    "tf.IndexedSlices(tf.constant([[1.0, 2.0]]), tf.constant([0]), "
    "tf.constant([2, 2]))",
    "tf.IndexedSlices(tf.constant([[1.0, 2.0]]), tf.constant([5]), "
    "tf.constant([2, 2]))",
    "tf.IndexedSlices(tf.constant([[1.0, 2.0]]), tf.constant([-1]), "
    "tf.constant([2, 2]))",
    "tf.IndexedSlices(tf.constant([[inf, 2.0]]), tf.constant([1]), "
    "tf.constant([2, 2]))",
])


def _k3_step(cls, grads, traced):
    """Two variables, one step of `grads`, then the state of everything."""
    dense = keras.Variable([1.0, 2.0], name="dense")
    table = keras.Variable([[1.0, 1.0], [1.0, 1.0]], name="table")
    opt = cls(keras.optimizers.Adam(0.5), initial_scale=4.0,
              dynamic_growth_steps=1)
    opt.build([dense, table])

    def step():
        values = [make(g) for g in grads]
        opt.apply(values, [dense, table])
    tf.function(step)() if traced else step()
    return {"dense": plain(dense), "table": plain(table),
            "slots": [plain(v) for v in opt.inner_optimizer.variables[1:]],
            "scale": plain(opt.dynamic_scale),
            "iterations": plain(opt.iterations)}


@_timed("keras3")
@FUZZ_FEW
@given(grads=st.tuples(DENSE_GRADS, TABLE_GRADS), traced=st.booleans())
def test_keras3_step(grads, traced):
    grads = list(grads)
    case = {"grads": grads, "traced": traced,
            "nonfinite": any("nan" in g or "inf" in g for g in grads)}
    ours = outcome(lambda: _k3_step(tf_lossscale.LossScaleOptimizer, grads,
                                    traced), lambda r: r)
    theirs = outcome(lambda: _k3_step(
        keras.mixed_precision.LossScaleOptimizer, grads, traced),
        lambda r: r)
    judge(TALLIES["keras3"], "keras3", "step", case, ours, theirs)


LOSSES = st.sampled_from([
    "tf.constant(4.0, tf.float16)", "tf.constant(4.0)",
    "tf.constant(4.0, tf.float64)", "tf.constant(4.0, tf.bfloat16)",
    "tf.constant(4)", "4.0", "None", "tf.constant([1.0, 60000.0], "
    "tf.float16)",
])


def _k3_scale_loss(cls, loss, built):
    variable = keras.Variable([1.0])
    opt = cls(keras.optimizers.SGD(0.5))
    if built:
        opt.apply([tf.constant([1.0])], [variable])
    return plain(opt.scale_loss(make(loss)))


@_timed("keras3")
@FUZZ
@given(loss=LOSSES, built=st.booleans())
def test_keras3_scale_loss(loss, built):
    case = {"loss": loss, "built": built}
    ours = outcome(lambda: _k3_scale_loss(tf_lossscale.LossScaleOptimizer,
                                          loss, built), lambda r: r)
    theirs = outcome(lambda: _k3_scale_loss(
        keras.mixed_precision.LossScaleOptimizer, loss, built), lambda r: r)
    judge(TALLIES["keras3"], "keras3", "scale_loss", case, ours, theirs)


# ---------------------------------------------------------- TF1 optimizer

V1 = tf.compat.v1
V1_LOSS_SCALES = st.one_of(NUMBERS, st.sampled_from([
    "'dynamic'", "OWN_FIXED", "OWN_DYNAMIC", "{'class_name': "
    "'FixedLossScale', 'config': {'loss_scale_value': 8.0}}"]))


def _v1_construct(cls, side, loss_scale):
    opt = cls(V1.train.GradientDescentOptimizer(0.5),
              _identifier(loss_scale, side))
    return plain(opt._loss_scale)  # TensorFlow has no public name for it


@_timed("v1")
@FUZZ
@given(loss_scale=V1_LOSS_SCALES)
def test_v1_construction(loss_scale):
    case = {"loss_scale": _identifier(loss_scale, tf_lossscale)}
    ours = outcome(lambda: _v1_construct(
        tf_lossscale.MixedPrecisionLossScaleOptimizer, tf_lossscale,
        loss_scale), lambda r: r)
    theirs = outcome(lambda: _v1_construct(
        TF.MixedPrecisionLossScaleOptimizer, TF, loss_scale), lambda r: r)
    judge(TALLIES["v1"], "v1", "construct", case, ours, theirs)


V1_GRADS = st.sampled_from([
    "tf.constant([1.0, 2.0])", "tf.constant([nan, 1.0])",
    "tf.constant([inf, 1.0])", "None", "tf.constant([1e38, 1.0])",
    "tf.IndexedSlices(tf.constant([[1.0]]), tf.constant([1]), "
    "tf.constant([2]))",
])


def _v1_step(cls, grad, fixed, resource):
    """One apply_gradients in a TF1 graph; the variable and scale after."""
    with tf.Graph().as_default():
        variable = V1.Variable([1.0, 2.0], use_resource=resource)
        other = V1.Variable([3.0], use_resource=resource)
        opt = cls(V1.train.GradientDescentOptimizer(0.5),
                  8.0 if fixed else "dynamic")
        train = opt.apply_gradients(
            [(make(grad), variable), (tf.constant([1.0]), other)])
        with V1.Session() as session:
            session.run(V1.global_variables_initializer())
            session.run(train)
            return {"variables": plain(session.run([variable, other])),
                    "scale": plain(session.run(opt._loss_scale()))}


@_timed("v1")
@FUZZ_FEW
@given(grad=V1_GRADS, fixed=st.booleans(), resource=st.booleans())
@example(grad="tf.constant([1.0, 2.0])", fixed=False, resource=False)
@example(grad="tf.constant([1.0, 2.0])", fixed=True, resource=False)
@example(grad="tf.constant([nan, 1.0])", fixed=True, resource=False)
def test_v1_step(grad, fixed, resource):
    case = {"grad": grad, "fixed": fixed, "resource": resource,
            "nonfinite": "nan" in grad or "inf" in grad}
    ours = outcome(lambda: _v1_step(
        tf_lossscale.MixedPrecisionLossScaleOptimizer, grad, fixed,
        resource), lambda r: r)
    theirs = outcome(lambda: _v1_step(
        TF.MixedPrecisionLossScaleOptimizer, grad, fixed, resource),
        lambda r: r)
    judge(TALLIES["v1"], "v1", "step", case, ours, theirs)
