"""The fixed cost per step: a model so small that its step is almost all overhead.

    python benchmarks/tiny_step.py [--optimizer SGD] [--steps 3000] [--xla]

Not part of the suite's table: the suite's models take milliseconds a step,
where a few tens of microseconds are below its noise. Here one Dense(8) on
a batch of 2 (Keras 3) is trained by the plain optimizer, Keras' own
`LossScaleOptimizer` and tf_lossscale's, called round-robin; it prints each
row's median step and its paired median over the plain step.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import rows  # noqa: E402

tf.get_logger().setLevel("ERROR")

ROWS = rows.LABELLED_ROWS


def _model(row: str, optimizer: str, xla: bool) -> keras.Model:
    make = rows.labelled_makers(keras, optimizer)[row]
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8)])
    model.compile(optimizer=make(), loss="mse", jit_compile=xla)
    return model


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--optimizer", default="SGD",
                        help="a keras.optimizers class (default SGD)")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--xla", action="store_true",
                        help="compile(jit_compile=True)")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    error = common.optimizer_error(keras, args.optimizer)
    if error:
        parser.error(error)
    x = np.ones((2, 8), "float32")
    y = np.zeros((2, 8), "float32")
    models = {row: _model(row, args.optimizer, args.xla) for row in ROWS}
    common.print_fit_steps(
        models, x, y, args.steps,
        f"one Dense(8), batch 2, {args.optimizer}, "
        f"{'XLA' if args.xla else 'no XLA'}, {args.steps} steps a row",
        unit="us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
