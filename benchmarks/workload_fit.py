"""Workloads (a) and (e): `compile` + `train_on_batch` of an MLP.

(a) is the default path (`jit_compile=False`); its rows are `plain`,
`barrier`, the original, `ours`, and with SGD also `<row> skipped` for the
two scalers (a NaN in every batch: every step skipped). (e) is the same
step compiled whole by XLA (`compile(jit_compile=True)`: what `fit` runs on
a GPU), with `limit` in place of `barrier` and no skipped rows. Each row's
model starts from the same weights; see `rows.py` for the optimizers.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

import numpy as np

import common
import rows

Batch = Tuple[np.ndarray, np.ndarray]


def _on_batch(model: Any, batch: Batch) -> Callable[[], Any]:
    return lambda: model.train_on_batch(*batch)


def _twins(keras: Any, sizes: common.Sizes,
           makers: Dict[str, Callable[[], Any]], jit_compile: bool
           ) -> Dict[str, Callable[[], Any]]:
    """Each row's twin (`sizes.twins` of them): the same optimizer and step
    on a one-layer model."""
    twins = {}
    for row, make in list(makers.items())[:sizes.twins]:
        twin = rows.mlp(keras, "relu", 8, 1)
        twin.compile(optimizer=make(), loss="mse", jit_compile=jit_compile)
        twins[row] = _on_batch(twin, (np.ones((2, 8), "float32"),
                                      np.zeros((2, 8), "float32")))
    return twins


def _compiled(keras: Any, sizes: common.Sizes, weights: Any,
              make: Callable[[], Any], jit_compile: bool) -> Any:
    """A fresh MLP with `weights`, compiled with a fresh optimizer."""
    model = rows.mlp(keras, "relu", sizes.mlp_width, sizes.mlp_layers)
    model.set_weights(weights)
    model.compile(optimizer=make(), loss="mse", jit_compile=jit_compile)
    return model


def _fresh(keras: Any, sizes: common.Sizes, weights: Any,
           make: Callable[[], Any], batch: Batch, jit_compile: bool
           ) -> Callable[[], Callable[[], Any]]:
    """A factory of the row's runner on a fresh model and optimizer: more
    first calls of the row (`common.again`)."""
    return lambda: _on_batch(
        _compiled(keras, sizes, weights, make, jit_compile), batch)


def _batch(sizes: common.Sizes) -> Batch:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((sizes.mlp_batch, sizes.mlp_width)
                            ).astype("float32")
    return x, np.zeros_like(x)


def workload_a(keras: Any, sizes: common.Sizes, optimizer: str
               ) -> Dict[str, Any]:
    """(a): the default path, with the barrier and the skipped rows."""
    x, y = _batch(sizes)
    x_nan = x.copy()
    x_nan[0, 0] = np.nan
    weights = rows.mlp(keras, "relu", sizes.mlp_width,
                           sizes.mlp_layers).get_weights()
    makers = rows.optimizer_makers(keras, optimizer, "barrier")
    warm = common.warm_up(_twins(keras, sizes, makers, jit_compile=False))
    timed: Dict[str, Callable[[], Any]] = {}
    fresh: common.Fresh = {}
    for row, make in makers.items():
        model = _compiled(keras, sizes, weights, make, jit_compile=False)
        timed[row] = _on_batch(model, (x, y))
        if not rows.is_scaler(row):
            continue
        fresh[row] = _fresh(keras, sizes, weights, make, (x, y), False)
        if optimizer == "SGD":
            # Every step non-finite, so every step is skipped.
            skip = _compiled(keras, sizes, weights, make, jit_compile=False)
            timed[row + " skipped"] = _on_batch(skip, (x_nan, y))
            fresh[row + " skipped"] = _fresh(keras, sizes, weights, make,
                                             (x_nan, y), False)
    params = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    common.log(f"(a) {optimizer}: {len(timed)} rows, {params} parameters")
    timings = common.interleave(timed, sizes.mlp_steps, log=common.log,
                                collect=sizes.collect_garbage, fresh=fresh,
                                first_calls=sizes.first_calls)
    common.log(f"(a) {optimizer}: done")
    return {"parameters": params, "variables": len(model.trainable_variables),
            "warm_up_s": warm,
            "rows": {k: t.as_json() for k, t in timings.items()}}


def workload_e(keras: Any, sizes: common.Sizes, optimizer: str
               ) -> Dict[str, Any]:
    """(e): (a) with `compile(jit_compile=True)`, and the limit row."""
    x, y = _batch(sizes)
    weights = rows.mlp(keras, "relu", sizes.mlp_width,
                           sizes.mlp_layers).get_weights()
    makers = rows.optimizer_makers(keras, optimizer, "limit")
    warm = common.warm_up(_twins(keras, sizes, makers, jit_compile=True))
    timed: Dict[str, Callable[[], Any]] = {}
    fresh: common.Fresh = {}
    for row, make in makers.items():
        model = _compiled(keras, sizes, weights, make, jit_compile=True)
        timed[row] = _on_batch(model, (x, y))
        if rows.is_scaler(row):
            fresh[row] = _fresh(keras, sizes, weights, make, (x, y), True)
    common.log(f"(e) {optimizer}, XLA: {len(timed)} rows")
    timings = common.interleave(timed, sizes.xla_steps, log=common.log,
                                collect=sizes.collect_garbage, fresh=fresh,
                                first_calls=sizes.first_calls)
    common.log(f"(e) {optimizer}: done")
    return {"variables": len(model.trainable_variables), "warm_up_s": warm,
            "rows": {k: t.as_json() for k, t in timings.items()}}
