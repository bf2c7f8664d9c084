"""Workloads (g) and (h): `compile` + `train_on_batch` of a transformer.

What every transformer (keras-hub's GPT-2, BERT) holds and the MLP of (a)
and (e) does not: an Embedding, MultiHeadAttention (with its own attention
dropout), Dropout after each residual branch, LayerNormalization; under
`mixed_float16`, as loss scaling is used. (g) runs it on the default path,
(h) compiled whole by XLA (`jit_compile=True`). Issue 32: with Dropout a
step under XLA cost 1.5-4 times Keras' own wrapper's with ours, because a
dynamic size in our skip branch made XLA inline the random-bit generator
each Dropout calls. Rows: plain, the original, ours; the target is ours at
most the original, in both.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

import numpy as np

import common
import rows

Batch = Tuple[np.ndarray, np.ndarray]

HEADS, BATCH, RATE = 2, 16, 0.1
POLICY = "mixed_float16"


def transformer(keras: Any, sizes: common.Sizes) -> Any:
    """Post-norm encoder blocks over an embedding; token logits."""
    vocab, sequence, width = sizes.transformer_shape
    tokens = keras.Input((sequence,), dtype="int32")
    x = keras.layers.Embedding(vocab, width, dtype=POLICY)(tokens)
    for _ in range(sizes.transformer_blocks):
        attended = keras.layers.MultiHeadAttention(
            HEADS, width // HEADS, dropout=RATE, dtype=POLICY)(x, x)
        attended = keras.layers.Dropout(RATE, dtype=POLICY)(attended)
        x = keras.layers.LayerNormalization(dtype=POLICY)(
            keras.layers.Add(dtype=POLICY)([x, attended]))
        hidden = keras.layers.Dense(2 * width, activation="gelu",
                                    dtype=POLICY)(x)
        hidden = keras.layers.Dense(width, dtype=POLICY)(hidden)
        hidden = keras.layers.Dropout(RATE, dtype=POLICY)(hidden)
        x = keras.layers.LayerNormalization(dtype=POLICY)(
            keras.layers.Add(dtype=POLICY)([x, hidden]))
    logits = keras.layers.Dense(vocab, dtype="float32")(x)
    return keras.Model(tokens, logits)


def describe(sizes: common.Sizes) -> str:
    """The model, in words (the report's description of (g) and (h))."""
    vocab, sequence, width = sizes.transformer_shape
    return (f"Embedding({vocab}, {width}), {sizes.transformer_blocks} x ("
            f"MultiHeadAttention({HEADS} heads, dropout {RATE}) + Dropout("
            f"{RATE}) + LayerNormalization, Dense({2 * width}, gelu) + "
            f"Dense({width}) + Dropout({RATE}) + LayerNormalization), "
            f"Dense({vocab}) logits; {POLICY}; batch {BATCH} x {sequence} "
            "tokens")


def _compiled(keras: Any, sizes: common.Sizes, weights: Any,
              make: Callable[[], Any], jit_compile: bool) -> Any:
    model = transformer(keras, sizes)
    model.set_weights(weights)
    model.compile(optimizer=make(), jit_compile=jit_compile,
                  loss=keras.losses.SparseCategoricalCrossentropy(
                      from_logits=True))
    return model


def _on_batch(model: Any, batch: Batch) -> Callable[[], Any]:
    return lambda: model.train_on_batch(*batch)


def _batch(sizes: common.Sizes) -> Batch:
    vocab, sequence, _ = sizes.transformer_shape
    rng = np.random.default_rng(0)
    x = rng.integers(0, vocab, (BATCH, sequence)).astype("int32")
    return x, np.roll(x, -1, axis=1)


def workload(keras: Any, sizes: common.Sizes, optimizer: str,
             jit_compile: bool) -> Dict[str, Any]:
    """(g) without XLA, (h) with: plain, the original and ours."""
    letter = "h" if jit_compile else "g"
    batch = _batch(sizes)
    weights = transformer(keras, sizes).get_weights()
    makers = rows.optimizer_makers(keras, optimizer, None)
    timed: Dict[str, Callable[[], Any]] = {}
    fresh: common.Fresh = {}
    for row, make in makers.items():
        model = _compiled(keras, sizes, weights, make, jit_compile)
        timed[row] = _on_batch(model, batch)
        if rows.is_scaler(row) and sizes.transformer_first_calls > 1:
            fresh[row] = (lambda make=make: _on_batch(_compiled(
                keras, sizes, weights, make, jit_compile), batch))
    params = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    common.log(f"({letter}) {optimizer}: {len(timed)} rows, {params} "
               "parameters")
    timings = common.interleave(timed, sizes.xla_steps, log=common.log,
                                collect=sizes.collect_garbage, fresh=fresh,
                                first_calls=sizes.transformer_first_calls)
    common.log(f"({letter}) {optimizer}: done")
    return {"model": describe(sizes),
            "parameters": params,
            "variables": len(model.trainable_variables),
            "rows": {k: t.as_json() for k, t in timings.items()}}
