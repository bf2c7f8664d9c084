"""Runs the workloads for one Keras in this process and writes JSON.

    python benchmarks/worker.py --keras {keras3,tf_keras} --mode MODE --out F

tf_keras must be chosen before TensorFlow is imported
(`TF_USE_LEGACY_KERAS=1`), so each Keras gets its own process; `run.py`
starts both. Rows per Keras:

- keras3: `plain` (the inner optimizer), `barrier` (the plain optimizer made
  to wait for every gradient before any update), `ours`
  (`tf_lossscale.LossScaleOptimizer`), `keras3` (Keras'
  `LossScaleOptimizer`), plus the limit rows of (c).
- tf_keras: `plain`, `ours` (our tf_keras flavour), `tf_keras` (its own
  `LossScaleOptimizer`).
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
    parser.add_argument("--workloads", default="abcd")
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

def _with_barrier(inner_cls: type) -> type:
    """`inner_cls`, made to wait for every gradient before any update.

    One NoOp depends on all gradients and every op of the update depends on
    it: the wait itself, without a per-gradient op (an Identity per
    gradient would add per-op overhead the wait does not need).
    """
    class Barrier(inner_cls):
        def apply(self, grads, trainable_variables=None):
            grads = list(grads)
            ready = tf.group(*[g for g in grads if g is not None])
            with tf.control_dependencies([ready]):
                return super().apply(grads, trainable_variables)
    return Barrier


def optimizer_rows(name: str) -> Dict[str, Callable[[], Any]]:
    """Row name -> factory of a fresh optimizer wrapping `name` ('SGD'...)."""
    inner = getattr(keras.optimizers, name)
    lr = 1e-4
    rows = {"plain": lambda: inner(learning_rate=lr)}
    if LEGACY:
        rows["tf_keras"] = lambda: keras.mixed_precision.LossScaleOptimizer(
            inner(learning_rate=lr))
    else:
        rows["barrier"] = lambda: _with_barrier(inner)(learning_rate=lr)
        rows["keras3"] = lambda: keras.mixed_precision.LossScaleOptimizer(
            inner(learning_rate=lr))
    rows["ours"] = lambda: tf_lossscale.LossScaleOptimizer(
        inner(learning_rate=lr))
    return rows


def _is_scaler(row: str) -> bool:
    return row in ("ours", "keras3", "tf_keras")


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
    timings = common.interleave(rows, sizes.mlp_steps)
    log(f"(a) {optimizer}: done")
    return {"parameters": params, "variables": len(model.trainable_variables),
            "rows": {k: t.as_json() for k, t in timings.items()}}


# --- (b) tf.function GradientTape loop over ~1500 small variables ----------

def _tape_step(model, optimizer, row: str) -> Callable[[Any, Any], Any]:
    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
            if row == "ours" and LEGACY or row == "tf_keras":
                target = optimizer.get_scaled_loss(loss)
            elif _is_scaler(row):
                target = optimizer.scale_loss(loss)
            else:
                target = loss
        variables = model.trainable_variables
        grads = tape.gradient(target, variables)
        if row == "ours" and LEGACY or row == "tf_keras":
            grads = optimizer.get_unscaled_gradients(grads)
        optimizer.apply_gradients(zip(grads, variables))
        return loss
    return step


def workload_b(sizes: common.Sizes) -> Dict[str, Any]:
    w = sizes.many_width
    x = tf.random.normal((32, w))
    y = tf.zeros((32, w))
    weights = _mlp("tanh", w, sizes.many_layers).get_weights()
    rows = {}
    for row, make in optimizer_rows("SGD").items():
        model = _mlp("tanh", w, sizes.many_layers)
        model.set_weights(weights)
        step = _tape_step(model, make(), row)
        rows[row] = (lambda s: lambda: s(x, y).numpy())(step)
    log(f"(b) {len(model.trainable_variables)} variables")
    timings = common.interleave(rows, sizes.many_steps)
    log("(b) done")
    return {"variables": len(model.trainable_variables),
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


def _check_rows(shapes: List[tuple]) -> Dict[str, Callable[[], Any]]:
    grads = [tf.Variable(tf.random.normal(s)) for s in shapes]
    total = sum(int(np.prod(s)) for s in shapes)
    one = tf.Variable(tf.random.normal([total]))
    scale = tf.Variable(INITIAL_SCALE)
    keras_fn = _keras_check_and_unscale()
    read = lambda: [v.read_value() for v in grads]  # noqa: E731

    # Each row returns the tensors it produced and a scalar: returned
    # tensors cannot be pruned (a control dependency on them can), and
    # returning them costs every row the same.
    def plain():
        return read(), tf.constant(True)

    def ours():
        return finite.unscale_and_check(read(), scale)

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

    rows = {"plain": plain, "ours": ours,
            "tf_keras" if LEGACY else "keras3": theirs}
    if not LEGACY:
        rows.update({"one read": one_read, "one tensor": one_tensor,
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
        timings = common.interleave(rows, sizes.check_steps)
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
            row["tf_keras" if LEGACY else "keras3"] = hlo_counts(
                theirs, grads, scale)
        log(f"(d) {n} gradients: {row}")
        out["per gradient count"][str(n)] = row
    return out


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
    with open(ARGS.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
