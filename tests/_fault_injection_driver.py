"""Long runs with injected gradient faults, checked against plain optimizers.

Used by `tests/test_fault_injection.py`: in-process for the Keras 3 and TF1
flavours, and as a script in a process of its own (TF_USE_LEGACY_KERAS=1)
for the tf_keras flavour:

    TF_USE_LEGACY_KERAS=1 python tests/_fault_injection_driver.py \
        --flavour tf_keras --dtype float16 float32 --steps 2000

A run trains three small variables for `steps` steps. Each step's true
gradients are random; NaN, +Inf, -Inf or huge-but-finite values are put at
random steps and positions (fixed seed), and the loss scale itself makes
float16 gradients overflow when it grows too far. After every step the run
checks, and raises `AssertionError` naming the step otherwise, that:

- the verdict (skip or apply) and the (scale, counter) pair equal the
  plain-Python model `tests/_model.py` fed the expected verdicts;
- a skipped step left every variable and slot bit-identical;
- the variables and slots equal, byte for byte, those of a plain copy of
  the inner optimizer fed the unscaled gradients on applied steps;
- no variable or slot is non-finite.

The injected values travel as tensor arguments of one traced step, so
nothing retraces.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _model import PythonLossScale  # noqa: E402

SHAPES = [(4,), (2, 3), ()]
KINDS = ("nan", "+inf", "-inf", "huge")
INJECT_RATE = 0.08  # share of steps that get injected faults
LEARNING_RATE = 0.01
MOMENTUM = 0.9
GROWTH_STEPS = {"float16": 8, "float32": 4}
INITIAL_SCALE = 2.0**15

Arrays = List[np.ndarray]


class Plan:
    """The true gradients and injected faults of every step (fixed seed)."""

    def __init__(self, dtype: str, steps: int, seed: int,
                 faults_in: str) -> None:
        """`faults_in`: "scaled" puts the faults into the scaled gradients
        (what Keras' optimizers receive), "true" into the true gradients
        (what a TF1 loss produces before the graph scales it)."""
        self.faults_in = faults_in
        self.dtype = np.dtype(dtype)
        self.steps = steps
        rng = np.random.default_rng(seed)
        self.initial = [rng.normal(size=s).astype(self.dtype) for s in SHAPES]
        self.grads = [[rng.normal(scale=0.5, size=s).astype(self.dtype)
                       for s in SHAPES] for _ in range(steps)]
        self.faults: List[List[Tuple[int, int, str]]] = []
        for _ in range(steps):
            faults = []
            if rng.random() < INJECT_RATE:
                for _ in range(rng.integers(1, 3)):
                    index = int(rng.integers(len(SHAPES)))
                    size = int(np.prod(SHAPES[index], dtype=int))
                    faults.append((index, int(rng.integers(size)),
                                   KINDS[int(rng.integers(len(KINDS)))]))
            self.faults.append(faults)

    def fault_value(self, kind: str, position: int, scale: float) -> float:
        """The injected value. "huge" is max/64 where the optimizer sees it:
        in the scaled gradients, so a true (unscaled) one is divided by the
        scale, or scaling alone would overflow it and it would never be
        applied."""
        huge = float(np.finfo(self.dtype).max) / 64
        if self.faults_in == "true":
            huge /= scale
        sign = -1.0 if position % 2 else 1.0
        return {"nan": np.nan, "+inf": np.inf, "-inf": -np.inf,
                "huge": sign * huge}[kind]

    def inject(self, step: int, grads: Arrays, scale: float) -> Arrays:
        """`grads` with this step's faults written in (copies)."""
        out = [g.copy() for g in grads]
        for index, position, kind in self.faults[step]:
            out[index].reshape(-1)[position] = self.fault_value(
                kind, position, scale)
        return out

    def inject_scaled(self, step: int, clean_scaled: Arrays,
                      scaled_fn: Callable[[Arrays, float], Arrays],
                      scale: float) -> Arrays:
        """This step's scaled gradients with its faults."""
        if self.faults_in == "scaled":
            return self.inject(step, clean_scaled, scale)
        return scaled_fn(self.inject(step, self.grads[step], scale), scale)


def scale_up(grads: Arrays, scale: float, dtype: np.dtype) -> Arrays:
    """What a loss scaled by `scale` gives: the product in float32, rounded
    to the gradient dtype (it overflows to inf where it would in training)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return [(g.astype(np.float32) * np.float32(scale)).astype(dtype)
                for g in grads]


def unscale(grads: Arrays, scale: float, dtype: np.dtype) -> Arrays:
    """`g * (1 / scale)` computed in float32, rounded to the gradient dtype."""
    inv = np.float32(1) / np.float32(scale)
    with np.errstate(over="ignore", invalid="ignore"):
        return [(g.astype(np.float32) * inv).astype(dtype) for g in grads]


def all_finite(arrays: Sequence[np.ndarray]) -> bool:
    return all(np.isfinite(a).all() for a in arrays)


def same_bytes(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> bool:
    return len(a) == len(b) and all(
        x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
        for x, y in zip(a, b))


class Summary:
    """Counts of what a run did, for the test to check."""

    def __init__(self) -> None:
        self.counts: Dict[str, int] = {
            "steps": 0, "applied": 0, "skipped": 0, "natural_overflows": 0,
            **{f"injected_{k}": 0 for k in KINDS}, "applied_with_huge": 0}
        self.scales: List[float] = []

    def as_dict(self) -> Dict:
        return dict(self.counts, min_scale=min(self.scales),
                    max_scale=max(self.scales))


Result = Dict[str, object]  # state, reference, iterations, scale, counter


def check_step(step: int, previous_scale: float, expected: Tuple[float, int],
               result: Result, previous: Arrays, applied: bool) -> None:
    """Raises AssertionError naming the step if one rule is broken."""
    where = (f"step {step} ({'applied' if applied else 'skipped'}, loss "
             f"scale before the step {previous_scale!r})")
    got = (result["scale"], result["counter"])
    state = result["state"]
    assert got == expected, (
        f"{where}: (scale, counter) {got} != plain-Python model {expected}")
    if not applied:
        assert same_bytes(state, previous), (
            f"{where}: a skipped step changed a variable or slot")
    assert same_bytes(state, result["reference"]), (
        f"{where}: variables/slots differ from the plain optimizer's fed the "
        f"unscaled gradients:\n{state}\nvs\n{result['reference']}")
    assert all_finite(state), f"{where}: a variable or slot is non-finite"
    if result["iterations"] is not None:
        assert result["iterations"] == step + 1, (
            f"{where}: iterations {result['iterations']}, expected "
            f"{step + 1}")


def drive(plan: Plan, scaled_fn: Callable[[Arrays, float], Arrays],
          step_fn: Callable[[int, Arrays, Arrays, bool], Result],
          first_state: Arrays) -> Summary:
    """Runs the plan and checks every step.

    `scaled_fn(grads, scale)` is what the flavour's scaled gradients are for
    true gradients `grads`; `step_fn(step, scaled, unscaled, applied)` runs
    one step of the LSO and of the reference (on `unscaled` if `applied`,
    else its skip) and returns what they hold after it.
    """
    model = PythonLossScale(INITIAL_SCALE, GROWTH_STEPS[plan.dtype.name], 2)
    summary = Summary()
    previous = first_state
    for step in range(plan.steps):
        scale = float(model.scale)
        clean_scaled = scaled_fn(plan.grads[step], scale)
        scaled = plan.inject_scaled(step, clean_scaled, scaled_fn, scale)
        unscaled = unscale(scaled, scale, plan.dtype)
        applied = all_finite(unscaled)
        expected = model.step(applied)
        result = step_fn(step, scaled, unscaled, applied)
        check_step(step, scale, expected, result, previous, applied)
        _count(summary, plan, step, clean_scaled, applied)
        summary.scales.append(expected[0])
        previous = result["state"]
    return summary


def _count(summary: Summary, plan: Plan, step: int, clean_scaled: Arrays,
           applied: bool) -> None:
    counts = summary.counts
    counts["steps"] += 1
    counts["applied" if applied else "skipped"] += 1
    counts["natural_overflows"] += not all_finite(clean_scaled)
    kinds = {kind for _, _, kind in plan.faults[step]}
    for kind in kinds:
        counts[f"injected_{kind}"] += 1
    counts["applied_with_huge"] += applied and kinds == {"huge"}


def _effect(fn: Callable, *args):
    """A `tf.cond` branch run for its effects."""
    import tensorflow as tf
    fn(*args)
    return tf.constant(0)


# Keras 3 and tf_keras: Keras' flow hands the optimizer scaled gradients;
# the faults are injected into those.


def run_keras(keras, flavour: str, dtype: str, steps: int, seed: int,
              jit_compile: bool = False) -> Dict:
    """A run of `tf_lossscale.LossScaleOptimizer` around `keras`'s SGD.

    With `jit_compile`, the step (ours and the reference's) is compiled
    whole by XLA, as Keras' `fit` compiles it on a GPU.
    """
    import tensorflow as tf

    import tf_lossscale

    plan = Plan(dtype, steps, seed, faults_in="scaled")
    make_var = keras.Variable if flavour == "keras3" else tf.Variable
    lso_vars = [make_var(v.copy(), dtype=dtype) for v in plan.initial]
    ref_vars = [make_var(v.copy(), dtype=dtype) for v in plan.initial]
    lso = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(LEARNING_RATE, momentum=MOMENTUM),
        initial_scale=INITIAL_SCALE,
        dynamic_growth_steps=GROWTH_STEPS[dtype])
    reference = keras.optimizers.SGD(LEARNING_RATE, momentum=MOMENTUM)
    lso.build(lso_vars)
    reference.build(ref_vars)
    lso_slots = _keras_slots(lso.inner_optimizer)
    ref_slots = _keras_slots(reference)
    assert len(lso_slots) == len(ref_slots) == len(SHAPES), lso_slots
    specs = [tf.TensorSpec(s, dtype) for s in SHAPES]

    def reference_apply(grads):
        reference.apply_gradients(zip(grads, ref_vars))

    def reference_skip():
        reference.iterations.assign_add(1)

    @tf.function(input_signature=[specs, specs, tf.TensorSpec([], tf.bool)],
                 jit_compile=jit_compile)
    def both_steps(scaled, unscaled, reference_applies):
        if flavour == "tf_keras":
            # tf_keras takes unmarked gradients as unscaled; its documented
            # flow unscales them first (the check and skip are the same).
            scaled = lso.get_unscaled_gradients(scaled)
        lso.apply_gradients(zip(scaled, lso_vars))
        tf.cond(reference_applies,
                lambda: _effect(reference_apply, unscaled),
                lambda: _effect(reference_skip))
        return ([tf.identity(v) for v in lso_vars + lso_slots],
                [tf.identity(v) for v in ref_vars + ref_slots],
                tf.identity(lso.iterations),
                tf.identity(lso.loss_scale),
                tf.identity(lso.dynamic_counter))

    def step_fn(step, scaled, unscaled, applied):
        state, ref_state, iterations, scale, counter = both_steps(
            scaled, unscaled, tf.constant(applied))
        return {"state": [t.numpy() for t in state],
                "reference": [t.numpy() for t in ref_state],
                "iterations": int(iterations), "scale": float(scale),
                "counter": int(counter)}

    def scaled_fn(grads, scale):
        return scale_up(grads, scale, plan.dtype)

    first = [np.array(v.numpy()) for v in lso_vars + lso_slots]
    return drive(plan, scaled_fn, step_fn, first).as_dict()


def _keras_slots(optimizer) -> list:
    """The optimizer's variables other than `iterations` and the rate."""
    variables = optimizer.variables
    if callable(variables):
        variables = variables()
    skip = ("iteration", "learning_rate")
    return [v for v in variables
            if not any(s in v.name.split("/")[-1] for s in skip)]


# TF1: graph mode and sessions. The loss is `sum(g_i * v_i)` with the
# planned (faulty) `g_i` fed by placeholders, so `minimize` itself makes
# `g_i * scale` (in the variable dtype, the scale cast to it) and unscales it.


def run_tf1(dtype: str, steps: int, seed: int) -> Dict:
    """A run of `MixedPrecisionLossScaleOptimizer` around MomentumOptimizer."""
    import tensorflow as tf

    import tf_lossscale

    plan = Plan(dtype, steps, seed, faults_in="true")
    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        def variables(prefix):
            return [v1.get_variable(f"{prefix}_{i}", initializer=v.copy(),
                                    dtype=dtype, use_resource=True)
                    for i, v in enumerate(plan.initial)]
        lso_vars, ref_vars = variables("lso"), variables("ref")
        true_grads = [v1.placeholder(dtype, s) for s in SHAPES]
        ref_grads = [v1.placeholder(dtype, s) for s in SHAPES]
        loss = tf.add_n([tf.reduce_sum(g * v)
                         for g, v in zip(true_grads, lso_vars)])
        loss_scale = tf_lossscale.DynamicLossScale(
            INITIAL_SCALE, GROWTH_STEPS[dtype], 2.0)
        lso = tf_lossscale.MixedPrecisionLossScaleOptimizer(
            v1.train.MomentumOptimizer(LEARNING_RATE, MOMENTUM), loss_scale)
        train_op = lso.minimize(loss, var_list=lso_vars)
        reference = v1.train.MomentumOptimizer(LEARNING_RATE, MOMENTUM)
        ref_op = reference.apply_gradients(zip(ref_grads, ref_vars))
        fetch = {
            "state": lso_vars + [lso.inner_optimizer.get_slot(v, "momentum")
                                 for v in lso_vars],
            "reference": ref_vars + [reference.get_slot(v, "momentum")
                                     for v in ref_vars],
            "scale": loss_scale(), "counter": loss_scale.good_steps}
        init = v1.global_variables_initializer()
    graph.finalize()  # A step that added ops would slow every later run.
    config = v1.ConfigProto()
    # Exact float16 products: grappler must not reorder the multiplications.
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    with v1.Session(graph=graph, config=config) as sess:
        sess.run(init)

        def step_fn(step, scaled, unscaled, applied):
            del scaled  # The graph scales the loss itself.
            ops = [train_op] + ([ref_op] if applied else [])
            # The read op made once: calling loss_scale() here would add a
            # node per step, and each run would extend the session's graph.
            scale = float(sess.run(fetch["scale"]))
            feed = dict(zip(true_grads,
                            plan.inject(step, plan.grads[step], scale)))
            feed.update(zip(ref_grads, unscaled))
            sess.run(ops, feed)
            result = sess.run(fetch)
            # TF1's optimizer has no `iterations`; its global_step counts
            # applied steps only (TensorFlow's rule), tested elsewhere.
            result.update(scale=float(result["scale"]),
                          counter=int(result["counter"]), iterations=None)
            return result

        def scaled_fn(grads, scale):
            return graph_scaled(grads, scale, plan.dtype)

        first = sess.run(fetch["state"])
        return drive(plan, scaled_fn, step_fn, first).as_dict()


def graph_scaled(grads: Arrays, scale: float, dtype: np.dtype) -> Arrays:
    """`g * cast(scale, dtype)` as a TF1 graph computes a scaled gradient."""
    with np.errstate(over="ignore", invalid="ignore"):
        cast_scale = np.float32(scale).astype(dtype)
        return [(g * cast_scale).astype(dtype) for g in grads]


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flavour", choices=["keras3", "tf_keras", "tf1"],
                        required=True)
    parser.add_argument("--dtype", choices=["float16", "float32"],
                        nargs="+", required=True)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jit-compile", action="store_true",
                        help="compile the Keras step whole with XLA")
    args = parser.parse_args(argv)
    for dtype in args.dtype:
        if args.flavour == "tf1":
            summary = run_tf1(dtype, args.steps, args.seed)
        else:
            if args.flavour == "tf_keras":
                import tf_keras as keras_module
            else:
                import keras as keras_module
            summary = run_keras(keras_module, args.flavour, dtype, args.steps,
                                args.seed, jit_compile=args.jit_compile)
        print(f"SUMMARY {dtype} " + json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
