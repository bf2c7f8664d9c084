"""What checking an embedding's gradient costs, on a large vocabulary.

    python benchmarks/vocab_cost.py [--optimizer SGD] [--vocab 50257]
        [--width 768] [--steps 60] [--xla]
    TF_USE_LEGACY_KERAS=1 python benchmarks/vocab_cost.py ...  # tf_keras

Not part of the suite's table. An Embedding(`vocab`, `width`) under
`mixed_float16` reads 32 tokens of a batch of 16, average-pooled into a
small head, so the embedding's update is most of the step. Its gradient is
a `tf.IndexedSlices` of 512 rows. Keras 3's own `LossScaleOptimizer` checks
it with `ops.isfinite`, which fills a predicate as large as the whole table
and scatters the rows into it; tf_keras' own and tf_lossscale read the rows
only. The plain optimizer, the Keras' own and ours are called round-robin;
it prints each row's median step and its paired median over the plain step.
The default sizes are GPT-2's vocabulary and width.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import rows  # noqa: E402

if rows.legacy():
    import tf_keras as keras  # noqa: E402
else:
    import keras  # noqa: E402


tf.get_logger().setLevel("ERROR")

ROWS = rows.LABELLED_ROWS
TOKENS, BATCH, CLASSES = 32, 16, 8
POLICY = "mixed_float16"


def _model(row: str, optimizer: str, vocab: int, width: int,
           xla: bool) -> keras.Model:
    make = rows.labelled_makers(keras, optimizer)[row]
    keras.utils.set_random_seed(0)
    tokens = keras.Input((TOKENS,), dtype="int32")
    x = keras.layers.Embedding(vocab, width, dtype=POLICY)(tokens)
    x = keras.layers.GlobalAveragePooling1D(dtype=POLICY)(x)
    x = keras.layers.Dense(64, activation="gelu", dtype=POLICY)(x)
    logits = keras.layers.Dense(CLASSES, dtype="float32")(x)
    model = keras.Model(tokens, logits)
    # The policy is per layer, so Keras 3's `compile` wraps no optimizer by
    # itself.
    model.compile(optimizer=make(), jit_compile=xla,
                  loss=keras.losses.SparseCategoricalCrossentropy(
                      from_logits=True))
    return model


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--optimizer", default="SGD",
                        help="a keras.optimizers class (default SGD)")
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--xla", action="store_true",
                        help="compile(jit_compile=True)")
    args = parser.parse_args(argv)
    for name in ("vocab", "width", "steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got "
                         f"{getattr(args, name)}")
    error = common.optimizer_error(keras, args.optimizer)
    if error:
        parser.error(error)
    rng = np.random.default_rng(0)
    x = rng.integers(0, args.vocab, (BATCH, TOKENS)).astype("int32")
    y = rng.integers(0, CLASSES, BATCH)
    models = {row: _model(row, args.optimizer, args.vocab, args.width,
                          args.xla) for row in ROWS}
    common.print_fit_steps(
        models, x, y, args.steps,
        f"{'tf_keras' if rows.legacy() else 'Keras 3'}, "
        f"Embedding({args.vocab}, {args.width}), {BATCH} x {TOKENS} tokens, "
        f"{args.optimizer}, {'XLA' if args.xla else 'no XLA'}, "
        f"{args.steps} steps a row")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
