"""Workloads (c) and (d): the check+unscale alone, timed and compiled.

(c) times check+unscale through the public API on gradients held in
variables, big (many large tensors) and small (many tensors of 1000
floats). Rows: `plain` (read the gradients and return them), the original
(what that Keras' LossScaleOptimizer runs per step), `ours`
(`get_unscaled_gradients` and the verdict it computed, read as
`apply_gradients` reads it), `one read` (a sum per tensor); Keras 3 also
`one tensor` and `plain one tensor` (one concatenated tensor).
(d) counts XLA fusions and kernels in the optimized HLO of the same work.
"""

from __future__ import annotations

import functools
import re
import time
from typing import Any, Callable, Dict, List, Tuple

import numpy as np
import tensorflow as tf

import common
import rows
import tf_lossscale
from tf_lossscale import finite

INITIAL_SCALE = 2.0 ** 15


def _keras_check_and_unscale(keras: Any) -> Callable[[List[Any], Any], Any]:
    """What the Keras LossScaleOptimizer of this process runs per step."""
    lso = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.SGD())
    if rows.legacy():
        # tf_keras' check is a module function its apply_gradients calls.
        from tf_keras.src.mixed_precision import loss_scale_optimizer as m
        return lambda g, s: (lso.get_unscaled_gradients(g),
                             m._is_all_finite(g))
    return lambda g, s: ([keras.ops.divide(t, s) for t in g],
                         lso.check_finite(g))


def _ours_through_the_public_api(keras: Any) -> Callable[[List[Any]], Any]:
    """Our check+unscale as the documented flow runs it.

    `get_unscaled_gradients` (public) divides and checks in one pass; the
    verdict it computed is read the way `apply_gradients` reads it when it
    is handed exactly those outputs (`_decide`, which adds no op: it only
    keeps the check from being pruned, as apply's use of it does).
    """
    opt = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD())

    def check_and_unscale(grads):
        unscaled = opt.get_unscaled_gradients(grads)
        taken = opt._decide(unscaled)
        verdict = taken.verdict
        if taken.scaled or verdict is None:
            raise RuntimeError(
                "apply_gradients would not reuse get_unscaled_gradients' "
                "verdict here: the (c) row no longer measures the "
                "documented flow's check")
        return unscaled, verdict
    return check_and_unscale


def _check_rows(keras: Any, shapes: List[tuple]
                ) -> Tuple[Dict[str, Callable[[], Any]], common.Fresh]:
    """The rows (row -> runner), and factories of fresh runners of the
    original and ours (their own `tf.function`s: more first calls)."""
    grads = [tf.Variable(tf.random.normal(s)) for s in shapes]
    total = sum(int(np.prod(s)) for s in shapes)
    one = tf.Variable(tf.random.normal([total]))
    scale = tf.Variable(INITIAL_SCALE)
    keras_fn = _keras_check_and_unscale(keras)
    ours_fn = _ours_through_the_public_api(keras)
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
    timed = {"plain": plain, rows.original_key(): theirs, "ours": ours,
             "one read": one_read}
    if not rows.legacy():
        timed.update({"one tensor": one_tensor,
                      "plain one tensor": plain_one_tensor})
    def runner(fn: Callable[[], Any]) -> Callable[[], Any]:
        traced = tf.function(fn, autograph=False)
        return lambda: traced()[1].numpy()

    return ({k: runner(fn) for k, fn in timed.items()},
            {k: functools.partial(runner, timed[k])
             for k in (rows.original_key(), "ours")})


def workload_c(keras: Any, sizes: common.Sizes) -> Dict[str, Any]:
    """(c): check+unscale timed, big and small."""
    cases: Dict[str, List[tuple]] = {
        "big": [(384, 1000)] * sizes.big_tensors
        + [(1000,)] * sizes.big_tensors,
        "small": [(1000,)] * sizes.small_tensors,
    }
    out = {}
    for case, shapes in cases.items():
        if not shapes:  # a mode without that case (the short one: no small)
            continue
        timed, fresh = _check_rows(keras, shapes)
        floats = sum(int(np.prod(s)) for s in shapes)
        common.log(f"(c) {len(shapes)} tensors, {floats} floats")
        timings = common.interleave(timed, sizes.check_steps, log=common.log,
                                    collect=sizes.collect_garbage,
                                    fresh=fresh,
                                    first_calls=sizes.first_calls)
        common.log(f"(c) {case}: done")
        out[case] = {"tensors": len(shapes), "floats": floats,
                     "rows": {k: t.as_json() for k, t in timings.items()}}
    return out


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


def workload_d(keras: Any, sizes: common.Sizes) -> Dict[str, Any]:
    """(d): XLA fusions of check+unscale over n gradients."""
    scale = tf.constant(INITIAL_SCALE)
    theirs = tf.function(_keras_check_and_unscale(keras), jit_compile=True)
    caller = tf.function(lambda g, s: finite.unscale_and_check(
        g, s, jit_compile=True), jit_compile=True)
    out: Dict[str, Any] = {"per gradient count": {}, "same bytes": {}}
    for n in sorted(set(sizes.fusions) | set(sizes.fusions_per_tensor)):
        grads = [tf.ones([1000]) for _ in range(n)]
        row = {}
        if not rows.legacy() and n in sizes.fusions:
            # The kernel unscale_and_check(jit_compile=True) launches (one
            # bucket of n gradients); and 10**6 floats in n gradients.
            row["ours"] = hlo_counts(finite._xla_unscale_and_check,
                                     [grads], [], 1.0 / scale)
            same = [tf.ones([10 ** 6 // n]) for _ in range(n)]
            out["same bytes"][str(n)] = hlo_counts(
                finite._xla_unscale_and_check, [same], [], 1.0 / scale)
        if n in sizes.fusions_per_tensor:
            if not rows.legacy():
                row["ours in a compiled caller"] = hlo_counts(
                    caller, grads, scale)
            row[rows.original_key()] = hlo_counts(theirs, grads, scale)
        common.log(f"(d) {n} gradients: {row}")
        out["per gradient count"][str(n)] = row
    return out
