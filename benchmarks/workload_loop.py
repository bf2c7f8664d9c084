"""Workloads (b) and (f): a custom `GradientTape` loop over many variables.

(b) is a `tf.function` step over `many_layers` x Dense(`many_width`, tanh)
(two variables a layer), SGD; (f) the same step as
`tf.function(jit_compile=True)` over `xla_loop_layers` layers, with the
limit row too. Rows: `plain`, the original, and ours in each flow the
original has: Keras 3's (`scale_loss` + `apply_gradients` with the scaled
gradients, its only flow, so its one row is the original of both of ours)
and the documented one (`get_scaled_loss`, `get_unscaled_gradients`,
`apply_gradients`: tf_keras' only flow). See `rows.loop_flows`.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, NamedTuple, Optional

import tensorflow as tf

import common
import rows


class _Loop(NamedTuple):
    """One loop workload, built: its variables, flows, warm-up, rows."""

    variables: int
    flows: Dict[str, str]
    warm_up_s: Dict[str, float]
    timed: Dict[str, Callable[[], Any]]
    fresh: common.Fresh  # the scaler rows: factories of fresh instances


def _runner(step: Any, x: Any, y: Any) -> Callable[[], Any]:
    return lambda: step(x, y).numpy()


def _instance(model: Any, make: Callable[[], Any], flow: str,
              jit_compile: Optional[bool], x: Any, y: Any
              ) -> Callable[[], Any]:
    """The row's runner: a fresh step function and a fresh optimizer on
    the workload's one model."""
    return _runner(rows.tape_step(model, make(), flow, jit_compile), x, y)


def _loop(keras: Any, sizes: common.Sizes, layers: int,
          jit_compile: Optional[bool], limit: bool
          ) -> _Loop:
    """Twins (called once), then the rows of one loop workload."""
    w = sizes.many_width
    x = tf.random.normal((32, w))
    y = tf.zeros((32, w))
    # Every row trains the same model: a row's cost is its step function's
    # (traced afresh for each row and each fresh instance), and one more
    # model would cost only its building (tf_keras: about 15 s at 750
    # layers). Each optimizer builds its own slots on the shared variables.
    model = rows.mlp(keras, "tanh", w, layers)
    makers = rows.loop_makers(keras, "SGD", limit)
    flows = rows.loop_flows(limit)
    if not sizes.keras_flow:
        flows.pop("ours", None)
    twins = {}
    for row, flow in list(flows.items())[:sizes.twins]:
        twin = rows.mlp(keras, "tanh", 8, 1)
        step = rows.tape_step(twin, makers[row](), flow, jit_compile)
        twins[row] = _runner(step, tf.ones((2, 8)), tf.zeros((2, 8)))
    warm = common.warm_up(twins)
    timed: Dict[str, Callable[[], Any]] = {}
    fresh: common.Fresh = {}
    for row, flow in flows.items():
        build = functools.partial(_instance, model, makers[row], flow,
                                  jit_compile, x, y)
        timed[row] = build()
        if rows.is_scaler(row) or row == "ours documented":
            fresh[row] = build
    return _Loop(len(model.trainable_variables), flows, warm, timed, fresh)


def _result(built: _Loop, timings: Dict[str, common.Timing]
            ) -> Dict[str, Any]:
    return {"variables": built.variables,
            "flows": built.flows, "warm_up_s": built.warm_up_s,
            "rows": {k: t.as_json() for k, t in timings.items()}}


def workload_b(keras: Any, sizes: common.Sizes) -> Dict[str, Any]:
    """(b): the default path (`tf.function`, no XLA)."""
    built = _loop(keras, sizes, sizes.many_layers, None, limit=False)
    common.log(f"(b) {built.variables} variables, "
               f"rows {list(built.timed)}")
    timings = common.interleave(built.timed, sizes.many_steps,
                                log=common.log,
                                collect=sizes.collect_garbage,
                                fresh=built.fresh,
                                first_calls=sizes.first_calls)
    common.log("(b) done")
    return _result(built, timings)


def workload_f(keras: Any, sizes: common.Sizes) -> Dict[str, Any]:
    """(f): the (b) loop as `tf.function(jit_compile=True)`, fewer layers."""
    built = _loop(keras, sizes, sizes.xla_loop_layers, True, limit=True)
    common.log(f"(f) XLA, {built.variables} "
               "variables")
    timings = common.interleave(built.timed, sizes.xla_steps,
                                log=common.log,
                                collect=sizes.collect_garbage,
                                fresh=built.fresh,
                                first_calls=sizes.first_calls)
    common.log("(f) done")
    return _result(built, timings)
