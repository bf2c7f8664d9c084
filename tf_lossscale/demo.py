"""`python -m tf_lossscale demo`: dynamic loss scaling in a real `fit`.

Trains a small regression model under Keras' `mixed_float16` policy on data
it makes itself, with `tf_lossscale.LossScaleOptimizer` and Keras' progress
bar. The loss scale starts far too high (2**24), so the first float16
gradients overflow: those steps are skipped and the scale halves until the
gradients fit. Then every `dynamic_growth_steps` finite steps it doubles,
until it overflows again and backs off: the saw-tooth that dynamic loss
scaling is. The demo prints every change of the scale, the skipped steps,
and writes `trajectory.csv` and a plot, `loss_scale.svg`, into `out_dir`.
"""

from __future__ import annotations

import math
import os
from typing import List, NamedTuple, Optional

import numpy as np

__all__ = ["Step", "run", "svg_plot"]

DEFAULT_STEPS = 240
BATCH_SIZE = 64
GROWTH_STEPS = 10
INITIAL_SCALE = 2.0**24


class Step(NamedTuple):
    """The optimizer's state after one training step."""

    step: int  # 1-based.
    scale: float
    counter: int
    skipped: bool


def _was_skipped(previous_scale: float, scale: float, counter: int) -> bool:
    """A step was skipped iff it restarted the count without growing.

    The rule (state_machine.next_state) restarts the count on a skip (the
    scale halves, or stays at its floor of 1) and on growth (the scale
    doubles); a finite step that does not grow counts on.
    """
    return counter == 0 and scale <= previous_scale


def _make_data(steps_per_epoch: int):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps_per_epoch * BATCH_SIZE, 8)).astype("float32")
    w = rng.normal(size=(8, 1)).astype("float32")
    y = np.tanh(x @ w) + 0.1 * x[:, :1] ** 2
    return x, y.astype("float32")


def _make_model(keras):
    init = keras.initializers.GlorotUniform
    return keras.Sequential([
        keras.Input((8,)),
        keras.layers.Dense(64, activation="relu",
                           kernel_initializer=init(seed=1)),
        keras.layers.Dense(64, activation="relu",
                           kernel_initializer=init(seed=2)),
        # The output in float32, as Keras' mixed precision guide advises.
        keras.layers.Dense(1, dtype="float32",
                           kernel_initializer=init(seed=3)),
    ])


def _train(steps: int) -> List[Step]:
    """Fits the model for `steps` steps; returns the state after each."""
    import keras

    import tf_lossscale

    epochs = next(e for e in (4, 3, 2, 1) if steps % e == 0)
    steps_per_epoch = steps // epochs
    x, y = _make_data(steps_per_epoch)
    opt = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.Adam(1e-3), initial_scale=INITIAL_SCALE,
        dynamic_growth_steps=GROWTH_STEPS)
    history: List[Step] = []

    class Recorder(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            previous = history[-1].scale if history else INITIAL_SCALE
            scale = float(opt.loss_scale)
            counter = int(opt.dynamic_counter)
            history.append(Step(len(history) + 1, scale, counter,
                                _was_skipped(previous, scale, counter)))

    previous_policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = _make_model(keras)
        model.compile(optimizer=opt, loss="mse")
        assert model.optimizer is opt  # Not wrapped a second time.
        model.fit(x, y, batch_size=BATCH_SIZE, epochs=epochs, shuffle=False,
                  callbacks=[Recorder()], verbose=1)
    finally:
        keras.mixed_precision.set_global_policy(previous_policy)
    if int(opt.iterations) != len(history):
        raise RuntimeError(
            f"iterations is {int(opt.iterations)} after {len(history)} "
            "steps; it must count skipped steps too.")
    return history


def _power(scale: float) -> str:
    exponent = math.log2(scale)
    return f"2^{exponent:g}" if exponent.is_integer() else f"{scale:g}"


def _report(history: List[Step]) -> str:
    lines = [f"Loss scale trajectory ({len(history)} steps, starting at "
             f"{_power(INITIAL_SCALE)}, dynamic_growth_steps={GROWTH_STEPS}):"]
    previous = INITIAL_SCALE
    for s in history:
        if s.skipped:
            lines.append(f"  step {s.step:4d}  {_power(previous):>6} -> "
                         f"{_power(s.scale):<6} overflow: step skipped")
        elif s.scale > previous:
            lines.append(f"  step {s.step:4d}  {_power(previous):>6} -> "
                         f"{_power(s.scale):<6} grew after {GROWTH_STEPS} "
                         "finite steps")
        previous = s.scale
    skipped = sum(s.skipped for s in history)
    lines.append(f"Skipped steps: {skipped} of {len(history)} (iterations "
                 "counted every one of them)")
    lines.append(f"Final loss scale: {history[-1].scale!r} "
                 f"({_power(history[-1].scale)})")
    return "\n".join(lines)


def svg_plot(history: List[Step], width: int = 720,
             height: int = 300) -> str:
    """An SVG of log2(scale) per step, with the skipped steps marked in red."""
    left, right, top, bottom = 56, 16, 28, 40
    n = len(history)
    exponents = [math.log2(s.scale) for s in history] + [
        math.log2(INITIAL_SCALE)]
    low, high = math.floor(min(exponents)), math.ceil(max(exponents))
    high = max(high, low + 1)

    def x(step: float) -> float:
        return left + (width - left - right) * step / max(n, 1)

    def y(exponent: float) -> float:
        return top + (height - top - bottom) * (high - exponent) / (
            high - low)

    points = [(x(0), y(math.log2(INITIAL_SCALE)))]
    for s in history:  # A step line: the scale holds until the next step.
        points.append((x(s.step), points[-1][1]))
        points.append((x(s.step), y(math.log2(s.scale))))
    path = " ".join(f"{px:.1f},{py:.1f}" for px, py in points)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" '
        'font-family="sans-serif" font-size="11">',
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="{width / 2}" y="16" text-anchor="middle" font-size="13">'
        f'Dynamic loss scale per step ({sum(s.skipped for s in history)} '
        'skipped steps in red)</text>',
    ]
    for e in range(low, high + 1):
        parts.append(
            f'<line x1="{left}" x2="{width - right}" y1="{y(e):.1f}" '
            f'y2="{y(e):.1f}" stroke="#ddd"/>'
            f'<text x="{left - 6}" y="{y(e) + 4:.1f}" text-anchor="end">'
            f'2^{e}</text>')
    for k in range(5):
        step = round(n * k / 4)
        parts.append(
            f'<text x="{x(step):.1f}" y="{height - bottom + 14}" '
            f'text-anchor="middle">{step}</text>')
    parts.append(
        f'<text x="{(left + width - right) / 2}" y="{height - 6}" '
        'text-anchor="middle">training step</text>')
    parts.append(f'<polyline class="scale" points="{path}" fill="none" '
                 'stroke="#1f5fbf" stroke-width="1.5"/>')
    for s in history:
        if s.skipped:
            parts.append(
                f'<circle class="skipped" cx="{x(s.step):.1f}" '
                f'cy="{y(math.log2(s.scale)):.1f}" r="3" fill="#d62728"/>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _write(history: List[Step], out_dir: str) -> List[str]:
    os.makedirs(out_dir, exist_ok=True)
    csv_path = os.path.join(out_dir, "trajectory.csv")
    with open(csv_path, "w") as f:
        f.write("step,loss_scale,dynamic_counter,skipped\n")
        f.writelines(f"{s.step},{s.scale!r},{s.counter},{int(s.skipped)}\n"
                     for s in history)
    svg_path = os.path.join(out_dir, "loss_scale.svg")
    with open(svg_path, "w") as f:
        f.write(svg_plot(history))
    return [svg_path, csv_path]


def run(steps: Optional[int] = None, out_dir: str = "demo_out") -> int:
    """Runs the demo; returns the exit code (0)."""
    steps = DEFAULT_STEPS if steps is None else steps
    if steps < 1:
        print(f"--steps must be a positive number of steps; got {steps}.")
        return 2
    history = _train(steps)
    print(_report(history))
    paths = _write(history, out_dir)
    print(f"Wrote {paths[0]} (plot) and {paths[1]}.")
    return 0
