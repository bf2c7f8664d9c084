"""What every row is built from: its optimizer, the MLP, the loop's step.

Shared by the workloads (`workload_*.py`) and `hlo_step.py`. Every
function takes the Keras module of the process (`keras` or `tf_keras`,
chosen before TensorFlow was imported). Rows, in first-call order:
`plain` (the inner optimizer); a reference that pays part of a scaler's
price and skips nothing: `barrier` (the update waits for every gradient:
the default path's (a)) or `limit` (the update also depends on one
all-finite read of the gradients: what the verdict alone costs inside a
step compiled by XLA); the original (`keras3` or `tf_keras`: that Keras'
own LossScaleOptimizer), then `ours` (after its original, so whatever a
process accumulates while tracing weighs on ours, not on the original);
and in the custom loop `ours documented` (TensorFlow's documented flow:
`get_scaled_loss`, `get_unscaled_gradients`, `apply_gradients`).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional

import tensorflow as tf

import tf_lossscale

LR = 1e-4

# Set by `worker.py --record-cost`: every workload also gets the row
# `NO_RECORD`, ours without the skip record (the step as it was before
# issue 22), so one run shows what the record costs.
WITH_NO_RECORD_ROW = False
NO_RECORD = "ours, no record"


def without_record(optimizer: Any) -> Any:
    """`optimizer` (ours) with no skip record: its skip branch records
    nothing, as before the record existed; everything else is the same."""
    optimizer._skip_recorder = lambda grads, variables: None
    return optimizer


def legacy() -> bool:
    """Whether this process runs tf_keras (Keras 2)."""
    return os.environ.get("TF_USE_LEGACY_KERAS") == "1"


def original_key() -> str:
    """The row of this process's original: `keras3` or `tf_keras`."""
    return "tf_keras" if legacy() else "keras3"


def is_scaler(row: str) -> bool:
    return row in ("ours", "keras3", "tf_keras")


def with_barrier(inner_cls: type) -> type:
    """`inner_cls`, made to wait for every gradient before any update.

    One NoOp depends on all gradients and every op of the update depends on
    it: the wait itself, without a per-gradient op (an Identity per
    gradient would add per-op overhead the wait does not need). Keras 3's
    `fit` and `apply_gradients` reach `apply`; tf_keras' reach
    `apply_gradients` (which builds the slots under `init_scope`, outside
    the dependency).
    """
    if legacy():
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


def written(owner: Any, verdict: tf.Tensor) -> Any:
    """An op that writes `verdict` into a variable of `owner`: wait for it.

    A control dependency on a computation with no effect is no wait at
    all: Grappler's dependency optimizer turns a node whose outputs feed
    only control edges into a NoOp, so the read it stands for never runs
    (measured: a step waiting on `is_finite(sum)` ran no Sum). A write has
    an effect, so it stays, with every read it takes.
    """
    if not hasattr(owner, "verdict_written"):
        with tf.init_scope():
            owner.verdict_written = tf.Variable(
                True, trainable=False, name="verdict_written")
    return owner.verdict_written.assign(verdict, read_value=False)


def _all_finite(grads: List[Any]) -> tf.Tensor:
    """One read of every gradient (a sum each, as (c)'s "one read" row):
    finite iff the total is (a verdict that overflowing sums could fool;
    the limit never skips, so only its cost matters)."""
    return tf.math.is_finite(tf.add_n(
        [tf.reduce_sum(g) for g in grads if g is not None]))


def _gated(grads: List[Any]) -> List[Any]:
    """The gradients, each now depending on the verdict over all of them.

    `where(finite, g, 0)`: a data dependency XLA cannot drop (a control
    dependency it may reorder), fused into the update; never a skip.
    """
    finite = _all_finite(grads)
    return [None if g is None else tf.where(finite, g, tf.zeros_like(g))
            for g in grads]


def with_limit(keras: Any, inner_cls: type) -> type:
    """`inner_cls` whose update also waits for one all-finite read."""
    if legacy():
        class LegacyLimit(inner_cls):
            def apply_gradients(self, grads_and_vars, *args, **kwargs):
                pairs = list(grads_and_vars)
                grads = _gated([g for g, _ in pairs])
                return super().apply_gradients(
                    list(zip(grads, [v for _, v in pairs])), *args, **kwargs)
        return LegacyLimit

    class Limit(inner_cls):
        def apply(self, grads, trainable_variables=None):
            return super().apply(_gated(list(grads)), trainable_variables)
    return Limit


def optimizer_makers(keras: Any, name: str,
                     reference: Optional[str] = "limit"
                     ) -> Dict[str, Callable[[], Any]]:
    """Row -> factory of a fresh optimizer wrapping `name` ('SGD', 'Adam').

    `reference`: the row between plain and the original, "barrier",
    "limit" or None (no such row).
    """
    inner = getattr(keras.optimizers, name)
    rows: Dict[str, Callable[[], Any]] = {
        "plain": lambda: inner(learning_rate=LR)}
    if reference == "barrier":
        rows["barrier"] = lambda: with_barrier(inner)(learning_rate=LR)
    elif reference == "limit":
        rows["limit"] = lambda: with_limit(keras, inner)(learning_rate=LR)
    rows[original_key()] = lambda: keras.mixed_precision.LossScaleOptimizer(
        inner(learning_rate=LR))
    rows["ours"] = lambda: tf_lossscale.LossScaleOptimizer(
        inner(learning_rate=LR))
    if WITH_NO_RECORD_ROW:
        rows[NO_RECORD] = lambda: without_record(rows["ours"]())
    return rows


# The stand-alone scripts' rows, by the labels they print.
LABELLED_ROWS = ("plain", "Keras' own", "tf_lossscale")


def labelled_makers(keras: Any, name: str) -> Dict[str, Callable[[], Any]]:
    """`optimizer_makers`' plain, original and ours rows, under the labels
    of `LABELLED_ROWS`: each factory wraps a fresh inner optimizer."""
    makers = optimizer_makers(keras, name, None)
    return dict(zip(LABELLED_ROWS, (makers["plain"], makers[original_key()],
                                    makers["ours"])))


def mlp(keras: Any, activation: str, width: int, layers: int) -> Any:
    return keras.Sequential(
        [keras.Input((width,))] +
        [keras.layers.Dense(width, activation=activation,
                            kernel_initializer="he_uniform")
         for _ in range(layers)])


# How each row of the custom loop scales: "none", "keras" (`scale_loss`,
# then `apply_gradients` with the scaled gradients: Keras 3's flow, the only
# one its LossScaleOptimizer has) or "documented" (`get_scaled_loss`,
# `get_unscaled_gradients`, `apply_gradients`: TensorFlow's documented flow,
# and tf_keras' only one).
def loop_flows(limit: bool = True) -> Dict[str, str]:
    """Row of the custom loop -> its flow (with the limit row if asked)."""
    if legacy():
        flows = {"plain": "none", "limit": "none", "tf_keras": "documented",
                 "ours documented": "documented"}
    else:
        flows = {"plain": "none", "limit": "none", "keras3": "keras",
                 "ours": "keras", "ours documented": "documented"}
    if not limit:
        del flows["limit"]
    if WITH_NO_RECORD_ROW:  # the flavour's main flow, as its ours row
        flows[NO_RECORD] = "documented" if legacy() else "keras"
    return flows


def tape_step(model: Any, optimizer: Any, flow: str,
              jit_compile: Optional[bool]) -> Any:
    """The custom loop's step, a `tf.function` (compiled whole if asked;
    None leaves `tf.function`'s default)."""
    @tf.function(jit_compile=jit_compile)
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


def loop_makers(keras: Any, name: str, limit: bool = True
                ) -> Dict[str, Callable[[], Any]]:
    """Row of the custom loop -> factory of its optimizer."""
    makers = optimizer_makers(keras, name, "limit" if limit else None)
    return {row: makers[row if row in makers else "ours"]
            for row in loop_flows(limit)}


def compiled_steps(keras: Any, opt: str, flow: str, layers: int, width: int,
                   rows: Optional[List[str]] = None) -> Dict[str, Any]:
    """Row -> a `tf.function(jit_compile=True)` of one step (for the HLO).

    flow "fit": `model.train_step((x, y))` after `compile`, what `fit`
    compiles; "loop": the custom loop's step.
    """
    out = {}
    if flow == "fit":
        for row, make in optimizer_makers(keras, opt).items():
            if rows and row not in rows:
                continue
            model = mlp(keras, "relu", width, layers)
            model.compile(optimizer=make(), loss="mse", jit_compile=True)
            out[row] = tf.function(
                (lambda m: lambda x, y: m.train_step((x, y)))(model),
                jit_compile=True)
    else:
        makers = loop_makers(keras, opt)
        for row, kind in loop_flows().items():
            if rows and row not in rows:
                continue
            model = mlp(keras, "relu", width, layers)
            optimizer = makers[row]()
            optimizer.build(model.trainable_variables) if not legacy() \
                else None
            out[row] = tape_step(model, optimizer, kind, jit_compile=True)
    return out
