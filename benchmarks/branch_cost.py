"""What the update costs inside a conditional run as one call: no profiler.

    python benchmarks/branch_cost.py [--tensors 40] [--size 512] [--steps 300]

Not part of the suite's table: it explains why (a)'s tf_keras SGD row sits
above its floor. tf_lossscale runs its apply branch as one function call
(`_tf_private.run_cond_as_one_call`), not lowered into a Switch per captured
tensor. A call holds its arguments until it returns, so an update op inside
it cannot write over the gradient it reads: it writes a fresh buffer. The
profiler counts those buffers but adds its own cost to every op; this times
the update alone. Each step makes `--tensors` gradients of size x size
(fresh each step), divides them by a power-of-two scale, sums each quotient
for the verdict and applies tf_keras SGD's update (`assign_add(-q * lr)`):

- no verdict: the update does not wait (the work without a check);
- wait: the update waits for the written verdict (`rows.written`), with no
  conditional: the floor;
- one call: the update in `tf.cond`, kept as one call as tf_lossscale keeps
  its apply branch; the other branch reads every quotient, as the skip
  record does;
- lowered: the same `tf.cond`, lowered (TensorFlow's default).

Each row's figure is its paired median over "wait".
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable, Dict, List, Tuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import rows  # noqa: E402
from tf_lossscale import _tf_private  # noqa: E402

tf.get_logger().setLevel("ERROR")

SCALE = 2.0 ** 15
ROWS = ("no verdict", "wait", "one call", "lowered")


class Step:
    """The variables of one row and its step: make, divide, check, update."""

    def __init__(self, row: str, tensors: int, size: int) -> None:
        self.row = row
        self.weights = [tf.Variable(tf.random.normal((size, size), seed=i))
                        for i in range(tensors)]
        self.scale = tf.Variable(SCALE, trainable=False)
        self.lr = tf.Variable(1e-9, trainable=False)
        self.recorded = tf.Variable(0.0, trainable=False)
        self.applied = tf.Variable(0, trainable=False)
        self.run = tf.function(self._step)

    def _quotients(self) -> Tuple[List[tf.Tensor], tf.Tensor]:
        grads = [w * 0.5 for w in self.weights]
        quotients = [g / self.scale for g in grads]
        verdict = tf.math.is_finite(
            tf.add_n([tf.reduce_sum(q) for q in quotients]))
        return quotients, verdict

    def _update(self, quotients: List[tf.Tensor]) -> tf.Tensor:
        for w, q in zip(self.weights, quotients):
            w.assign_add(-q * self.lr, read_value=False)
        self.applied.assign_add(1, read_value=False)
        return tf.constant(0)

    def _skip(self, quotients: List[tf.Tensor]) -> tf.Tensor:
        self.recorded.assign(tf.add_n(
            [tf.reduce_max(tf.abs(q)) for q in quotients]), read_value=False)
        return tf.constant(0)

    def _step(self) -> None:
        quotients, verdict = self._quotients()
        if self.row == "no verdict":
            self._update(quotients)
        elif self.row == "wait":
            with tf.control_dependencies([rows.written(self, verdict)]):
                self._update(quotients)
        else:
            taken = tf.cond(verdict, lambda: self._update(quotients),
                            lambda: self._skip(quotients))
            if self.row == "one call":
                _tf_private.run_cond_as_one_call(taken)


def steps(tensors: int, size: int) -> Dict[str, Callable[[], Any]]:
    """Row -> its traced step (a fresh set of variables each)."""
    return {row: Step(row, tensors, size).run for row in ROWS}


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=40)
    parser.add_argument("--size", type=int, default=512,
                        help="each gradient is size x size floats")
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args(argv)
    if min(args.tensors, args.size, args.steps) < 1:
        parser.error("--tensors, --size and --steps must be at least 1, got "
                     f"{args.tensors}, {args.size} and {args.steps}")
    timings = common.interleave(steps(args.tensors, args.size), args.steps)
    print(f"{args.tensors} x ({args.size} x {args.size}) float32, tf_keras "
          f"SGD's update, no XLA, {args.steps} steps a row")
    common.print_over(timings, base="wait")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
