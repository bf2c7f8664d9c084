"""What an exact scaler's `fit` step must cost without XLA: (a)'s floor.

    python benchmarks/fit_floor.py [--optimizer SGD] [--steps 200]
    TF_USE_LEGACY_KERAS=1 python benchmarks/fit_floor.py ...  # tf_keras

Not part of the suite's table: it explains (a)'s targets. The suite's
reference row, `barrier` (every update waits for every gradient), hands the
inner optimizer the gradients as they are. A scaler whose updates equal
the original's must hand it the gradients divided by the scale: a read and
a write of every gradient, which no op fuses without XLA. Rows, (a)'s
model (40 x Dense(512), batch 64) on Keras 3 or tf_keras, called
round-robin, each with its median step and its paired median over the
plain step:

- plain: the inner optimizer;
- barrier: the suite's reference row (`rows.with_barrier`);
- one read: the updates wait for a sum of every gradient (the verdict's
  read, nothing divided);
- divide + one read: every gradient divided by a power-of-two scale, each
  quotient summed, the updates wait for that verdict and apply the
  quotients: the work of an exact scaler, with no conditional, no scale
  update and no skip (it never skips: a cost, not a scaler);
- Keras' own `LossScaleOptimizer` and tf_lossscale's.

The two read rows write their verdict to a variable and wait for the
write (`rows.written`): waiting on the verdict itself, Grappler would drop
the read (until 2026-12-05 they did, and measured a read they never made).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable, Dict, List, Tuple

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

SCALE = 2.0 ** 15


def _sums_finite(grads: List[tf.Tensor]) -> tf.Tensor:
    return tf.math.is_finite(tf.add_n([tf.reduce_sum(g) for g in grads]))


Prepare = Callable[[Any, List[tf.Tensor]], Tuple[List[tf.Tensor], Any]]


def _waiting(inner_cls: type, prepare: Prepare) -> type:
    """`inner_cls` that applies `prepare(self, grads)[0]` once the op
    `prepare(self, grads)[1]` has run. Keras 3's `fit` reaches `apply`;
    tf_keras' reaches `apply_gradients` (which builds the slots under
    `init_scope`, outside the dependency)."""
    if rows.legacy():
        class LegacyWaiting(inner_cls):
            def apply_gradients(self, grads_and_vars, *args, **kwargs):
                pairs = list(grads_and_vars)
                grads, ready = prepare(self, [g for g, _ in pairs])
                with tf.control_dependencies([ready]):
                    return super().apply_gradients(
                        list(zip(grads, [v for _, v in pairs])),
                        *args, **kwargs)
        return LegacyWaiting

    class Waiting(inner_cls):
        def apply(self, grads, trainable_variables=None):
            grads, ready = prepare(self, list(grads))
            with tf.control_dependencies([ready]):
                return super().apply(grads, trainable_variables)
    return Waiting


def _read(owner: Any, grads: List[tf.Tensor]) -> Tuple[List[tf.Tensor], Any]:
    """The gradients as they are, and the write of their verdict."""
    return grads, rows.written(owner, _sums_finite(grads))


def _divide_and_read(owner: Any, grads: List[tf.Tensor]
                     ) -> Tuple[List[tf.Tensor], Any]:
    """The gradients divided by `SCALE` (held in a variable, as a scaler
    holds its scale), and the write of the quotients' verdict."""
    if not hasattr(owner, "scale_for_floor"):
        with tf.init_scope():
            owner.scale_for_floor = tf.Variable(
                SCALE, trainable=False, name="scale_for_floor")
    quotients = [g / owner.scale_for_floor for g in grads]
    return quotients, rows.written(owner, _sums_finite(quotients))


def with_read(inner_cls: type) -> type:
    """`inner_cls` whose updates wait for one read of every gradient."""
    return _waiting(inner_cls, _read)


def with_division(inner_cls: type) -> type:
    """`inner_cls` that applies every gradient divided by `SCALE`, once a
    sum of every quotient has been read."""
    return _waiting(inner_cls, _divide_and_read)


def makers(optimizer: str) -> Dict[str, Callable[[], Any]]:
    """Row -> factory of a fresh optimizer wrapping `optimizer`."""
    inner = getattr(keras.optimizers, optimizer)
    labelled = rows.labelled_makers(keras, optimizer)
    return {
        "plain": labelled["plain"],
        "barrier": lambda: rows.with_barrier(inner)(learning_rate=rows.LR),
        "one read": lambda: with_read(inner)(learning_rate=rows.LR),
        "divide + one read": lambda: with_division(inner)(
            learning_rate=rows.LR),
        "Keras' own": labelled["Keras' own"],
        "tf_lossscale": labelled["tf_lossscale"],
    }


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--optimizer", default="SGD",
                        help="a keras.optimizers class (default SGD)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--layers", type=int, default=40)
    parser.add_argument("--width", type=int, default=512)
    args = parser.parse_args(argv)
    if min(args.steps, args.layers, args.width) < 1:
        parser.error("--steps, --layers and --width must be at least 1, got "
                     f"{args.steps}, {args.layers} and {args.width}")
    error = common.optimizer_error(keras, args.optimizer)
    if error:
        parser.error(error)
    x = np.random.default_rng(0).standard_normal(
        (64, args.width)).astype("float32")
    y = np.zeros_like(x)
    weights = rows.mlp(keras, "relu", args.width, args.layers).get_weights()
    models = {}
    for row, make in makers(args.optimizer).items():
        model = rows.mlp(keras, "relu", args.width, args.layers)
        model.set_weights(weights)
        model.compile(optimizer=make(), loss="mse", jit_compile=False)
        models[row] = model
    common.print_fit_steps(
        models, x, y, args.steps,
        f"{'tf_keras' if rows.legacy() else 'Keras 3'}, {args.layers} x "
        f"Dense({args.width}), batch 64, {args.optimizer}, no XLA, "
        f"{args.steps} steps a row")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
