"""`python -m tf_lossscale demo`: dynamic loss scaling, step by step.

Fits a float16 linear model with a `tf.GradientTape` loop and a
`DynamicLossScale`, forcing an overflow every few steps so that the scale
visibly backs off and grows again, then prints the trajectory.
"""

from __future__ import annotations

import os
from typing import Optional

import numpy as np
import tensorflow as tf

from tf_lossscale.loss_scale import DynamicLossScale

__all__ = ["run"]


def run(steps: Optional[int] = None, out_dir: str = "demo_out") -> int:
    steps = steps or 60
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(256, 8)), tf.float16)
    y = tf.reduce_sum(x, axis=1, keepdims=True)
    w = tf.Variable(tf.zeros([8, 1]))
    loss_scale = DynamicLossScale(initial_loss_scale=2.0**15,
                                  increment_period=5)

    @tf.function
    def step(blow_up):
        with tf.GradientTape() as tape:
            pred = tf.matmul(x * tf.where(blow_up, tf.constant(1e4, tf.float16), 1),
                             tf.cast(w, tf.float16))
            loss = tf.reduce_mean(tf.cast(pred - tf.cast(y, pred.dtype),
                                          tf.float32) ** 2)
            scaled = loss * loss_scale()
        grads = [g / loss_scale() for g in tape.gradient(scaled, [w])]
        _, apply = loss_scale.update(grads)
        if apply:
            w.assign_sub(0.05 * grads[0])
        return loss, apply

    skipped = 0
    trajectory = []
    for i in range(steps):
        loss, applied = step(tf.constant(i % 17 == 16))
        skipped += int(not applied)
        trajectory.append(float(loss_scale()))
        print(f"step {i:3d}  loss {float(loss):10.4f}  scale {trajectory[-1]:9.0f}"
              f"  {'applied' if applied else 'SKIPPED'}")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "trajectory.csv"), "w") as f:
        f.write("step,scale\n")
        f.writelines(f"{i},{s}\n" for i, s in enumerate(trajectory))
    print(f"skipped steps: {skipped}; final scale {trajectory[-1]:.0f}")
    return 0
