"""Runs the workloads for one Keras in this process and writes JSON.

    python benchmarks/worker.py --keras {keras3,tf_keras} --mode MODE --out F

tf_keras must be chosen before TensorFlow is imported
(`TF_USE_LEGACY_KERAS=1`), so each Keras gets its own process; `run.py`
starts both. Each flavour is compared with its own original in its own
process. Rows (the original is `keras3` or `tf_keras`, the Keras of this
process):

- (a) `plain` (the inner optimizer), `barrier` (the plain optimizer made to
  wait for every gradient before any update), the original
  (`keras.mixed_precision.LossScaleOptimizer` of this Keras), `ours`
  (`tf_lossscale.LossScaleOptimizer`); with SGD also `<row> skipped` (a
  NaN in every batch).
- (b) `plain`, the original, `ours` (Keras 3 only: `scale_loss` +
  `apply_gradients` with scaled gradients, Keras 3's flow) and `ours
  documented` (`get_scaled_loss`, `get_unscaled_gradients`,
  `apply_gradients`). Keras 3's original has only `scale_loss` +
  `apply_gradients` (it unscales inside), so that is its row for both
  flows; tf_keras' original runs the documented flow.
- (c) `plain`, the original, `ours` (the public `get_unscaled_gradients`,
  and the verdict it computed, read as `apply_gradients` reads it), `one
  read`; Keras 3 also `one tensor` and `plain one tensor`.
- (d) XLA fusion counts.
- (e) (a) compiled whole by XLA (`compile(jit_compile=True)`): `plain`,
  `limit` (the plain optimizer whose update also depends on one
  all-finite read of its gradients, never skipping), the original, `ours`.
- (f) the custom loop of (b) as `tf.function(jit_compile=True)`, with the
  rows of (b) plus `limit`. The rows are built by `worker_xla.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from typing import Any, Callable, Dict, List

ARGS = None


def _parse(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keras", choices=["keras3", "tf_keras"],
                        required=True)
    parser.add_argument("--mode", default="quick")
    parser.add_argument("--workloads", default="abcdef")
    parser.add_argument("--out", required=True)
    return parser.parse_args(argv)


if __name__ == "__main__":
    ARGS = _parse(sys.argv[1:])
    if ARGS.keras == "tf_keras":
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import common  # noqa: E402
import worker_xla  # noqa: E402

tf.get_logger().setLevel("ERROR")

if ARGS is not None and ARGS.keras == "tf_keras":
    import tf_keras as keras  # noqa: E402
else:
    import keras  # noqa: E402

import tf_lossscale  # noqa: E402
from tf_lossscale import finite  # noqa: E402

LEGACY = ARGS is not None and ARGS.keras == "tf_keras"
INITIAL_SCALE = 2.0 ** 15


_START = time.perf_counter()


def log(message: str) -> None:
    print(f"[{'tf_keras' if LEGACY else 'keras3'} "
          f"{time.perf_counter() - _START:5.0f} s] {message}",
          file=sys.stderr, flush=True)


# --- optimizers -------------------------------------------------------------

ORIGINAL = "tf_keras" if LEGACY else "keras3"


def _with_barrier(inner_cls: type) -> type:
    """`inner_cls`, made to wait for every gradient before any update.

    One NoOp depends on all gradients and every op of the update depends on
    it: the wait itself, without a per-gradient op (an Identity per
    gradient would add per-op overhead the wait does not need). Keras 3's
    `fit` and `apply_gradients` reach `apply`; tf_keras' reach
    `apply_gradients` (which builds the slots under `init_scope`, outside
    the dependency).
    """
    if LEGACY:
        class LegacyBarrier(inner_cls):
            def apply_gradients(self, grads_and_vars, *args, **kwargs):
                pairs = list(grads_and_vars)
                ready = tf.group(*[g for g, _ in pairs if g is not None])
                with tf.control_dependencies([ready]):
                    return super().apply_gradients(pairs, *args, **kwargs)
        return LegacyBarrier

    class Barrier(inner_cls):
        def apply(self, grads, trainable_variables=None):
            grads = list(grads)
            ready = tf.group(*[g for g in grads if g is not None])
            with tf.control_dependencies([ready]):
                return super().apply(grads, trainable_variables)
    return Barrier


def optimizer_rows(name: str, barrier: bool = True
                   ) -> Dict[str, Callable[[], Any]]:
    """Row name -> factory of a fresh optimizer wrapping `name` ('SGD'...).

    In first-call order: plain, barrier, the original, then ours (after
    its original, so whatever a process accumulates while tracing weighs
    on ours, not on the original).
    """
    inner = getattr(keras.optimizers, name)
    lr = 1e-4
    rows = {"plain": lambda: inner(learning_rate=lr)}
    if barrier:
        rows["barrier"] = lambda: _with_barrier(inner)(learning_rate=lr)
    rows[ORIGINAL] = lambda: keras.mixed_precision.LossScaleOptimizer(
        inner(learning_rate=lr))
    rows["ours"] = lambda: tf_lossscale.LossScaleOptimizer(
        inner(learning_rate=lr))
    return rows


def _is_scaler(row: str) -> bool:
    return row in ("ours", "keras3", "tf_keras")


def warm_up(rows: Dict[str, Callable[[], Any]]) -> Dict[str, float]:
    """Calls each row's one-layer twin once; its seconds per row.

    The first trace that reaches a library's code in a process pays once
    for what later traces reuse (AutoGraph converting that code, lazy
    imports): about 2 s for tf_lossscale's, whichever row comes first. The
    twins pay it, so each row's first call is its own model's trace, graph
    optimisation and first step.
    """
    return {name: round(common.time_first_call(fn), 3)
            for name, fn in rows.items()}


# --- (a) compile / train_on_batch of a ~10M-parameter MLP ------------------

def _mlp(activation: str, width: int, layers: int):
    return keras.Sequential(
        [keras.Input((width,))] +
        [keras.layers.Dense(width, activation=activation,
                            kernel_initializer="he_uniform")
         for _ in range(layers)])


def workload_a(sizes: common.Sizes, optimizer: str) -> Dict[str, Any]:
    w = sizes.mlp_width
    rng = np.random.default_rng(0)
    x = rng.standard_normal((sizes.mlp_batch, w)).astype("float32")
    y = np.zeros_like(x)
    x_nan = x.copy()
    x_nan[0, 0] = np.nan
    weights = _mlp("relu", w, sizes.mlp_layers).get_weights()
    twins = {}
    for row, make in optimizer_rows(optimizer).items():
        twin = _mlp("relu", 8, 1)
        twin.compile(optimizer=make(), loss="mse", jit_compile=False)
        twins[row] = (lambda m: lambda: m.train_on_batch(
            np.ones((2, 8), "float32"), np.zeros((2, 8), "float32")))(twin)
    warm = warm_up(twins)
    rows = {}
    for row, make in optimizer_rows(optimizer).items():
        model = _mlp("relu", w, sizes.mlp_layers)
        model.set_weights(weights)
        model.compile(optimizer=make(), loss="mse", jit_compile=False)
        rows[row] = (lambda m, d: lambda: m.train_on_batch(*d))(model, (x, y))
        if optimizer == "SGD" and _is_scaler(row):
            # Every step non-finite, so every step is skipped.
            skip = _mlp("relu", w, sizes.mlp_layers)
            skip.set_weights(weights)
            skip.compile(optimizer=make(), loss="mse", jit_compile=False)
            rows[row + " skipped"] = (
                lambda m, d: lambda: m.train_on_batch(*d))(skip, (x_nan, y))
    params = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    log(f"(a) {optimizer}: {len(rows)} rows, {params} parameters")
    timings = common.interleave(rows, sizes.mlp_steps, log=log)
    log(f"(a) {optimizer}: done")
    return {"parameters": params, "variables": len(model.trainable_variables),
            "warm_up_s": warm,
            "rows": {k: t.as_json() for k, t in timings.items()}}


# --- (b) tf.function GradientTape loop over ~1500 small variables ----------

# How each row of (b) scales: "none" (plain), "keras" (`scale_loss`, then
# `apply_gradients` with the scaled gradients: Keras 3's flow, the only one
# its LossScaleOptimizer has) or "documented" (`get_scaled_loss`,
# `get_unscaled_gradients`, `apply_gradients`: TensorFlow's documented flow,
# and tf_keras' only one).
FLOWS_B = ({"plain": "none", "keras3": "keras", "ours": "keras",
            "ours documented": "documented"} if not LEGACY else
           {"plain": "none", "tf_keras": "documented",
            "ours documented": "documented"})


def _tape_step(model, optimizer, flow: str) -> Callable[[Any, Any], Any]:
    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
            if flow == "documented":
                target = optimizer.get_scaled_loss(loss)
            elif flow == "keras":
                target = optimizer.scale_loss(loss)
            else:
                target = loss
        variables = model.trainable_variables
        grads = tape.gradient(target, variables)
        if flow == "documented":
            grads = optimizer.get_unscaled_gradients(grads)
        optimizer.apply_gradients(zip(grads, variables))
        return loss
    return step


def workload_b(sizes: common.Sizes) -> Dict[str, Any]:
    w = sizes.many_width
    x = tf.random.normal((32, w))
    y = tf.zeros((32, w))
    weights = _mlp("tanh", w, sizes.many_layers).get_weights()
    makers = optimizer_rows("SGD", barrier=False)
    twins = {}
    for row, flow in FLOWS_B.items():
        twin = _mlp("tanh", 8, 1)
        step = _tape_step(twin, makers[
            "ours" if row.startswith("ours") else row](), flow)
        twins[row] = (lambda s: lambda: s(tf.ones((2, 8)),
                                          tf.zeros((2, 8))).numpy())(step)
    warm = warm_up(twins)
    rows = {}
    for row, flow in FLOWS_B.items():
        model = _mlp("tanh", w, sizes.many_layers)
        model.set_weights(weights)
        make = makers["ours" if row.startswith("ours") else row]
        step = _tape_step(model, make(), flow)
        rows[row] = (lambda s: lambda: s(x, y).numpy())(step)
    log(f"(b) {len(model.trainable_variables)} variables, rows {list(rows)}")
    timings = common.interleave(rows, sizes.many_steps, log=log)
    log("(b) done")
    return {"variables": len(model.trainable_variables), "flows": FLOWS_B,
            "warm_up_s": warm,
            "rows": {k: t.as_json() for k, t in timings.items()}}


# --- (c) the isolated check+unscale ----------------------------------------

def _keras_check_and_unscale() -> Callable[[List[Any], Any], Any]:
    """What the Keras LossScaleOptimizer of this process runs per step."""
    lso = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.SGD())
    if LEGACY:
        # tf_keras' check is a module function its apply_gradients calls.
        from tf_keras.src.mixed_precision import loss_scale_optimizer as m
        return lambda g, s: (lso.get_unscaled_gradients(g),
                             m._is_all_finite(g))
    return lambda g, s: ([keras.ops.divide(t, s) for t in g],
                         lso.check_finite(g))


def _ours_through_the_public_api() -> Callable[[List[Any]], Any]:
    """Our check+unscale as the documented flow runs it.

    `get_unscaled_gradients` (public) divides and checks in one pass; the
    verdict it computed is read the way `apply_gradients` reads it when it
    is handed exactly those outputs (`_decide`, which adds no op: it only
    keeps the check from being pruned, as apply's use of it does).
    """
    opt = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD())

    def check_and_unscale(grads):
        unscaled = opt.get_unscaled_gradients(grads)
        already_unscaled, verdict = opt._decide(unscaled)
        if not already_unscaled or verdict is None:
            raise RuntimeError(
                "apply_gradients would not reuse get_unscaled_gradients' "
                "verdict here: the (c) row no longer measures the "
                "documented flow's check")
        return unscaled, verdict
    return check_and_unscale


def _check_rows(shapes: List[tuple]) -> Dict[str, Callable[[], Any]]:
    grads = [tf.Variable(tf.random.normal(s)) for s in shapes]
    total = sum(int(np.prod(s)) for s in shapes)
    one = tf.Variable(tf.random.normal([total]))
    scale = tf.Variable(INITIAL_SCALE)
    keras_fn = _keras_check_and_unscale()
    ours_fn = _ours_through_the_public_api()
    read = lambda: [v.read_value() for v in grads]  # noqa: E731

    # Each row returns the tensors it produced and a scalar: returned
    # tensors cannot be pruned (a control dependency on them can), and
    # returning them costs every row the same.
    def plain():
        return read(), tf.constant(True)

    def ours():
        return ours_fn(read())

    def theirs():
        return keras_fn(read(), scale)

    def one_read():
        g = read()
        return g, tf.add_n([tf.reduce_sum(t) for t in g])

    def one_tensor():
        t = one.read_value()
        return [t], tf.reduce_sum(t)

    def plain_one_tensor():
        return [one.read_value()], tf.constant(True)

    # First-call order: the original before ours.
    rows = {"plain": plain, ORIGINAL: theirs, "ours": ours,
            "one read": one_read}
    if not LEGACY:
        rows.update({"one tensor": one_tensor,
                     "plain one tensor": plain_one_tensor})
    return {k: (lambda f: lambda: f()[1].numpy())(
        tf.function(fn, autograph=False)) for k, fn in rows.items()}


def workload_c(sizes: common.Sizes) -> Dict[str, Any]:
    cases = {
        "big": [(384, 1000)] * sizes.big_tensors
        + [(1000,)] * sizes.big_tensors,
        "small": [(1000,)] * sizes.small_tensors,
    }
    out = {}
    for case, shapes in cases.items():
        rows = _check_rows(shapes)
        floats = sum(int(np.prod(s)) for s in shapes)
        log(f"(c) {len(shapes)} tensors, {floats} floats")
        timings = common.interleave(rows, sizes.check_steps, log=log)
        log(f"(c) {case}: done")
        out[case] = {"tensors": len(shapes), "floats": floats,
                     "rows": {k: t.as_json() for k, t in timings.items()}}
    return out


# --- (d) XLA fusions of check+unscale --------------------------------------

_TRIVIAL = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast"}


def hlo_counts(fn: Any, *args: Any) -> Dict[str, Any]:
    """Fusions and kernels (non-trivial top-level instructions) after XLA."""
    start = time.perf_counter()
    hlo = fn.experimental_get_compiler_ir(*args)(stage="optimized_hlo")
    entry = hlo[hlo.index("\nENTRY"):]
    ops = re.findall(r"= \S+ ([\w-]+)\(", entry)
    return {"fusions": len(re.findall(r"= \S+ fusion\(", hlo)),
            "kernels": sum(op not in _TRIVIAL for op in ops),
            "compile_s": round(time.perf_counter() - start, 2)}


def workload_d(sizes: common.Sizes) -> Dict[str, Any]:
    scale = tf.constant(INITIAL_SCALE)
    theirs = tf.function(_keras_check_and_unscale(), jit_compile=True)
    caller = tf.function(lambda g, s: finite.unscale_and_check(
        g, s, jit_compile=True), jit_compile=True)
    out: Dict[str, Any] = {"per gradient count": {}, "same bytes": {}}
    for n in sorted(set(sizes.fusions) | set(sizes.fusions_per_tensor)):
        grads = [tf.ones([1000]) for _ in range(n)]
        row = {}
        if not LEGACY and n in sizes.fusions:
            # The kernel unscale_and_check(jit_compile=True) launches (one
            # bucket of n gradients); and 10**6 floats in n gradients.
            row["ours"] = hlo_counts(finite._xla_unscale_and_check,
                                     [grads], [], 1.0 / scale)
            same = [tf.ones([10 ** 6 // n]) for _ in range(n)]
            out["same bytes"][str(n)] = hlo_counts(
                finite._xla_unscale_and_check, [same], [], 1.0 / scale)
        if n in sizes.fusions_per_tensor:
            if not LEGACY:
                row["ours in a compiled caller"] = hlo_counts(
                    caller, grads, scale)
            row[ORIGINAL] = hlo_counts(
                theirs, grads, scale)
        log(f"(d) {n} gradients: {row}")
        out["per gradient count"][str(n)] = row
    return out


# --- (e) and (f): the same steps compiled whole by XLA ---------------------

def workload_e(sizes: common.Sizes, optimizer: str) -> Dict[str, Any]:
    """(a) with `compile(jit_compile=True)`: what `fit` runs on a GPU."""
    w = sizes.mlp_width
    rng = np.random.default_rng(0)
    x = rng.standard_normal((sizes.mlp_batch, w)).astype("float32")
    y = np.zeros_like(x)
    weights = _mlp("relu", w, sizes.mlp_layers).get_weights()
    makers = worker_xla.optimizer_makers(keras, optimizer)
    twins = {}
    for row, make in makers.items():
        twin = _mlp("relu", 8, 1)
        twin.compile(optimizer=make(), loss="mse", jit_compile=True)
        twins[row] = (lambda m: lambda: m.train_on_batch(
            np.ones((2, 8), "float32"), np.zeros((2, 8), "float32")))(twin)
    warm = warm_up(twins)
    rows = {}
    for row, make in makers.items():
        model = _mlp("relu", w, sizes.mlp_layers)
        model.set_weights(weights)
        model.compile(optimizer=make(), loss="mse", jit_compile=True)
        rows[row] = (lambda m, d: lambda: m.train_on_batch(*d))(model, (x, y))
    log(f"(e) {optimizer}, XLA: {len(rows)} rows")
    timings = common.interleave(rows, sizes.xla_steps, log=log)
    log(f"(e) {optimizer}: done")
    return {"variables": len(model.trainable_variables), "warm_up_s": warm,
            "rows": {k: t.as_json() for k, t in timings.items()}}


def workload_f(sizes: common.Sizes) -> Dict[str, Any]:
    """The (b) loop as `tf.function(jit_compile=True)`, fewer layers."""
    w = sizes.many_width
    x = tf.random.normal((32, w))
    y = tf.zeros((32, w))
    weights = _mlp("tanh", w, sizes.xla_loop_layers).get_weights()
    makers = worker_xla.loop_makers(keras, "SGD")
    flows = worker_xla.loop_flows()
    twins = {}
    for row, flow in flows.items():
        twin = _mlp("tanh", 8, 1)
        step = worker_xla.tape_step(twin, makers[row](), flow, True)
        twins[row] = (lambda s: lambda: s(tf.ones((2, 8)),
                                          tf.zeros((2, 8))).numpy())(step)
    warm = warm_up(twins)
    rows = {}
    for row, flow in flows.items():
        model = _mlp("tanh", w, sizes.xla_loop_layers)
        model.set_weights(weights)
        step = worker_xla.tape_step(model, makers[row](), flow, True)
        rows[row] = (lambda s: lambda: s(x, y).numpy())(step)
    log(f"(f) XLA, {len(model.trainable_variables)} variables")
    timings = common.interleave(rows, sizes.xla_steps, log=log)
    log("(f) done")
    return {"variables": len(model.trainable_variables), "flows": flows,
            "warm_up_s": warm,
            "rows": {k: t.as_json() for k, t in timings.items()}}


def main() -> int:
    sizes = common.MODES[ARGS.mode]
    keras.utils.set_random_seed(0)  # once, before anything is traced
    result: Dict[str, Any] = {"keras": ARGS.keras, "mode": ARGS.mode,
                              "versions": {"tensorflow": tf.__version__,
                                           "keras": keras.__version__}}
    if "a" in ARGS.workloads:
        result["a"] = {opt: workload_a(sizes, opt) for opt in sizes.optimizers}
    if "b" in ARGS.workloads:
        result["b"] = workload_b(sizes)
    if "c" in ARGS.workloads:
        result["c"] = workload_c(sizes)
    if "d" in ARGS.workloads:
        result["d"] = workload_d(sizes)
    if "e" in ARGS.workloads:
        result["e"] = {opt: workload_e(sizes, opt)
                       for opt in sizes.optimizers}
    if "f" in ARGS.workloads:
        result["f"] = workload_f(sizes)
    with open(ARGS.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
