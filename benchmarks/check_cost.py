"""Where the time of (c) big goes: the division, and the check after it.

    python benchmarks/check_cost.py [--tensors 86] [--steps 60]

Not part of the suite's table: it explains target (c). Same gradients as
(c) big (86 x (384, 1000) + 86 x (1000,) float32, held in variables) and
the same scale, in a `tf.function` without XLA; each row reads the
gradients, adds one way of doing the work, and returns what it made:

- plain: the gradients read and returned (the baseline of every row);
- one read: a sum per gradient (the unit of the target, "x one read");
- divide only: the division per gradient that ours runs, no verdict: what
  an unscale alone costs, a read and a write of every gradient;
- tf_lossscale: `finite.unscale_and_check`, what `get_unscaled_gradients`
  runs (the division, then a sum of each quotient while it is in cache);
- tf_lossscale, one XLA kernel: the same with `jit_compile=True` (the
  default on a GPU): the division and the check fused by XLA, launched
  from the graph as one kernel;
- sums of the inputs: the division, and the verdict from sums of the
  scaled gradients instead (a second read of each input);
- add_n per shape: the division, and the verdict from one elementwise sum
  of the quotients of each shape, then its sum (two ops, not one a
  gradient; the quotients are read back from memory);
- Keras 3: `check_finite` on the scaled gradients and a divide per tensor.

Without XLA TensorFlow runs every op as its own kernel, so no row can fuse
the check into the division: "divide only" is the floor of any exact
check+unscale here, and the target of 2 x one read lies below it when the
division alone costs about 2 x one read.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable, Dict, List

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import workload_check  # noqa: E402
from tf_lossscale import finite  # noqa: E402

tf.get_logger().setLevel("ERROR")

SCALE = 2.0 ** 15


def _divide(grads: List[tf.Tensor], scale: tf.Tensor) -> List[tf.Tensor]:
    return [tf.math.divide_no_nan(g, scale) for g in grads]


def _finite_sum(parts: List[tf.Tensor]) -> tf.Tensor:
    return tf.math.is_finite(tf.add_n([tf.reduce_sum(p) for p in parts]))


def _add_n_per_shape(quotients: List[tf.Tensor]) -> tf.Tensor:
    shapes: Dict[tuple, List[tf.Tensor]] = {}
    for q in quotients:
        shapes.setdefault(tuple(q.shape.as_list()), []).append(q)
    return _finite_sum([tf.add_n(group) for group in shapes.values()])


def rows(grads: List[tf.Variable], scale: tf.Variable
         ) -> Dict[str, Callable[[], Any]]:
    """Row -> a traced function returning (tensors made, a scalar)."""
    keras_check = workload_check._keras_check_and_unscale(keras)  # (c)'s

    def read() -> List[tf.Tensor]:
        return [g.read_value() for g in grads]

    def divided(verdict: Callable[[List[tf.Tensor], List[tf.Tensor]], Any]
                ) -> Callable[[], Any]:
        def row():
            g = read()
            q = _divide(g, scale)
            return q, verdict(g, q)
        return row

    made: Dict[str, Callable[[], Any]] = {
        "plain": lambda: (read(), tf.constant(True)),
        "one read": lambda: (lambda g: (g, _finite_sum(g)))(read()),
        "divide only": divided(lambda g, q: tf.constant(True)),
        "tf_lossscale": lambda: finite.unscale_and_check(read(), scale),
        "tf_lossscale, one XLA kernel": lambda: finite.unscale_and_check(
            read(), scale, jit_compile=True),
        "sums of the inputs": divided(lambda g, q: _finite_sum(g)),
        "add_n per shape": divided(lambda g, q: _add_n_per_shape(q)),
        "Keras 3": lambda: keras_check(read(), scale),
    }
    out = {}
    for name, fn in made.items():
        traced = tf.function(fn, autograph=False)
        out[name] = (lambda t: lambda: t()[1].numpy())(traced)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=86)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args(argv)
    tf.random.set_seed(0)
    shapes = [(384, 1000)] * args.tensors + [(1000,)] * args.tensors
    grads = [tf.Variable(tf.random.normal(s)) for s in shapes]
    scale = tf.Variable(SCALE)
    timings = common.interleave(rows(grads, scale), args.steps)
    plain = timings["plain"].median_ms()
    read = timings["one read"].median_ms() - plain
    floats = sum(g.shape.num_elements() for g in grads)
    print(f"| {len(shapes)} tensors, {floats / 1e6:.1f}M floats | ms "
          "| + ms over plain | x one read |\n|---|---:|---:|---:|")
    for name, timing in timings.items():
        ms = timing.median_ms()
        print(f"| {name} | {ms:.2f} | {ms - plain:.2f} "
              f"| {(ms - plain) / read:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
