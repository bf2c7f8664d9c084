"""Where the overhead of workload (b) goes: the check, the wait, the branch.

    python benchmarks/cond_cost.py [--layers 750] [--steps 40]

Not part of the suite's table: it explains target (b). Same model and loop
as (b) (Keras 3, SGD), with rows that add one ingredient at a time:

- plain: the inner optimizer;
- wait: the update waits for every gradient (the barrier row of the suite);
- check, no skip: `finite.unscale_and_check`, then the update waits for the
  verdict (written to a variable: `rows.written`) but always runs (not a
  loss scaler: it never skips);
- check + tf.cond: the same, with the update inside `tf.cond(finite, ...)`,
  which is how an exact skip of an arbitrary inner optimizer is written;
- tf_lossscale and Keras 3: the real optimizers.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import rows  # noqa: E402
import tf_lossscale  # noqa: E402
from tf_lossscale import finite  # noqa: E402

tf.get_logger().setLevel("ERROR")

SCALE = 2.0 ** 15


class ProbeSGD(keras.optimizers.SGD):
    """SGD with one ingredient of a loss scaler (see the module docstring)."""

    def __init__(self, mode: str, **kwargs):
        super().__init__(**kwargs)
        self.mode = mode

    def scale_loss(self, loss):
        return loss * SCALE if self.mode.startswith("check") else loss

    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        parent = super().apply
        if self.mode == "wait":
            with tf.control_dependencies([tf.group(*grads)]):
                return parent(grads, trainable_variables)
        unscaled, ok = finite.unscale_and_check(grads, tf.constant(SCALE))
        if self.mode == "check, no skip":
            with tf.control_dependencies([rows.written(self, ok)]):
                return parent(unscaled, trainable_variables)

        def update():
            parent(unscaled, trainable_variables)
            return tf.constant(0)
        tf.cond(ok, update, lambda: tf.constant(0))


def _step(model, optimizer):
    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
            target = (optimizer.scale_loss(loss)
                      if hasattr(optimizer, "scale_loss") else loss)
        variables = model.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(target, variables),
                                      variables))
        return loss
    return step


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=750)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args(argv)
    keras.utils.set_random_seed(0)

    def mlp():
        return keras.Sequential(
            [keras.Input((16,))] + [keras.layers.Dense(16, activation="tanh")
                                    for _ in range(args.layers)])

    weights = mlp().get_weights()
    optimizers = {
        "plain": lambda: keras.optimizers.SGD(1e-4),
        "wait": lambda: ProbeSGD("wait", learning_rate=1e-4),
        "check, no skip": lambda: ProbeSGD("check, no skip",
                                           learning_rate=1e-4),
        "check + tf.cond": lambda: ProbeSGD("check + cond",
                                            learning_rate=1e-4),
        "tf_lossscale": lambda: tf_lossscale.LossScaleOptimizer(
            keras.optimizers.SGD(1e-4)),
        "Keras 3": lambda: keras.mixed_precision.LossScaleOptimizer(
            keras.optimizers.SGD(1e-4)),
    }
    x, y = tf.random.normal((32, 16)), tf.zeros((32, 16))
    calls = {}
    for name, make in optimizers.items():
        model = mlp()
        model.set_weights(weights)
        step = _step(model, make())
        calls[name] = (lambda s: lambda: s(x, y).numpy())(step)
    timings = common.interleave(calls, args.steps)
    plain = timings["plain"].median_ms()
    print(f"| {args.layers} x Dense(16), {2 * args.layers} variables "
          "| step ms | overhead |\n|---|---:|---:|")
    for name, timing in timings.items():
        ms = timing.median_ms()
        print(f"| {name} | {ms:.2f} | {100 * (ms / plain - 1):+.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
