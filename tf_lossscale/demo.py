"""`python -m tf_lossscale demo`: dynamic loss scaling in a real `fit`.

Trains a small regression model under Keras' `mixed_float16` policy on data
it makes itself, with `tf_lossscale.LossScaleOptimizer` and
`tf_lossscale.LossScaleMonitor`, so Keras' progress bar shows the loss
scale and the skipped steps. The scale starts far too high (2**24): the
first float16 gradients overflow, those steps are skipped and the scale
halves until the gradients fit. Then every `dynamic_growth_steps` (10, not
the usual 2000) finite steps it doubles, until it overflows again and backs
off: the saw-tooth that dynamic loss scaling is. Two thirds of the way in,
it plants one overflow in a known layer (`hidden_2`'s kernel gradient is
multiplied by the largest float16 for one step), and the monitor's line
names that layer.

It prints what it is about to show, the progress bar, and a short summary,
and writes into `out_dir`:

- `trajectory.csv`: per step, the epoch, the batch's loss, the loss scale
  the step used and whether it was skipped;
- `loss_scale.png`: the loss and the loss scale on a shared step axis, the
  skipped steps marked, the epoch boundaries drawn (needs matplotlib,
  `pip install "tf_lossscale[demo]"`; without it the demo says so and
  still writes the CSV).
"""

from __future__ import annotations

import math
import os
import sys
from typing import IO, Any, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

__all__ = ["CSV_COLUMNS", "Step", "bar_line", "plot", "run", "summary"]

DEFAULT_STEPS = 240
BATCH_SIZE = 64
GROWTH_STEPS = 10
INITIAL_SCALE = 2.0**24
PLANTED_LAYER = "hidden_2"
FLOAT16_MAX = 65504.0
CSV_NAME = "trajectory.csv"
PNG_NAME = "loss_scale.png"
CSV_COLUMNS = ("step", "epoch", "loss", "loss_scale", "skipped")
INSTALL_HINT = ('pip install "tf_lossscale[demo]" (or, in a checkout, '
                'pip install ".[demo]")')


class Step(NamedTuple):
    """One training step, as the CSV and the plot show it."""

    step: int  # 1-based.
    epoch: int  # 1-based.
    loss: float  # The batch's loss (mean over its samples).
    scale: float  # The loss scale this step's loss was multiplied by.
    skipped: bool  # Non-finite gradients: not applied, the scale backed off.


def _power(scale: float) -> str:
    """2^k for a power of two, else the number."""
    exponent = math.log2(scale)
    return f"2^{exponent:g}" if exponent.is_integer() else f"{scale:g}"


def bar_line(batch: int, batches: int, loss: float, scale: float,
             skipped: int, streak: int) -> str:
    """The demo's progress line: integers as integers, under 80 columns.

    `15/15  loss: 0.1454  loss_scale: 2^17  skipped_steps: 9  skip_streak:
    0` (Keras' own bar prints every value as a float, e.g.
    `0.0000e+00`, and runs to 200 columns with these four keys).
    """
    width = len(str(batches))
    return (f"{batch:>{width}}/{batches}  loss: {loss:.4f}  loss_scale: "
            f"{_power(scale)}  skipped_steps: {skipped}  skip_streak: "
            f"{streak}")


def _bar(keras: Any, epochs: int, stream: IO[str]) -> Any:
    """A Keras callback that prints `bar_line` for the demo's `fit`.

    On a terminal it redraws the line after every batch (a carriage return,
    no escape code); otherwise it writes one line per epoch, so a log file
    holds no control characters. Listed after the monitor (its keys)."""

    class Bar(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            stream.write(f"Epoch {epoch + 1}/{epochs}\n")
            self.line = ""

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            logs = logs or {}
            self.line = bar_line(
                batch + 1, int(self.params.get("steps") or batch + 1),
                float(logs["loss"]), float(logs["loss_scale"]),
                int(logs["skipped_steps"]), int(logs["skip_streak"]))
            if stream.isatty():
                stream.write("\r" + self.line)
                stream.flush()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            stream.write(("\r" if stream.isatty() else "") + self.line
                         + "\n")
            stream.flush()

    return Bar()


def _intro() -> str:
    return "\n".join([
        "Demo: a small model trains in float16 with dynamic loss scaling; "
        "the progress bar shows loss_scale and skipped_steps.",
        f"Extreme on purpose: the scale starts at {_power(INITIAL_SCALE)} "
        f"(float16 gradients overflow at once) and doubles every "
        f"{GROWTH_STEPS} good steps (default: 2000). One overflow is "
        f"planted in layer {PLANTED_LAYER}: the monitor's line names it."])


def _make_data(samples: int) -> Tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(samples, 8)).astype("float32")
    w = rng.normal(size=(8, 1)).astype("float32")
    y = np.tanh(x @ w) + 0.1 * x[:, :1] ** 2
    return x, y.astype("float32")


def _planted_dense(keras: Any, units: int, seed: int, name: str) -> Any:
    """A relu `Dense`-like layer whose kernel gradient is multiplied by its
    `fault` weight (1, or the largest float16 for the planted step)."""
    import tensorflow as tf

    @tf.custom_gradient
    def hook(kernel: Any, fault: Any) -> Any:
        def grad(upstream: Any) -> Any:
            return upstream * tf.cast(fault, upstream.dtype), tf.zeros_like(
                fault)
        return tf.identity(kernel), grad

    class PlantedDense(keras.layers.Layer):
        def build(self, input_shape: Any) -> None:
            self.kernel = self.add_weight(
                name="kernel", shape=(int(input_shape[-1]), units),
                initializer=keras.initializers.GlorotUniform(seed=seed))
            self.bias = self.add_weight(name="bias", shape=(units,),
                                        initializer="zeros")
            self.fault = self.add_weight(name="fault", shape=(),
                                         initializer="ones", trainable=False)

        def call(self, x: Any) -> Any:
            kernel = hook(tf.cast(self.kernel, x.dtype),
                          tf.cast(self.fault, x.dtype))
            return tf.nn.relu(tf.matmul(x, kernel)
                              + tf.cast(self.bias, x.dtype))

    return PlantedDense(name=name)


def _make_model(keras: Any) -> Any:
    init = keras.initializers.GlorotUniform
    return keras.Sequential([
        keras.Input((8,)),
        keras.layers.Dense(64, activation="relu",
                           kernel_initializer=init(seed=1), name="hidden_1"),
        _planted_dense(keras, 64, seed=2, name=PLANTED_LAYER),
        # The output in float32, as Keras' mixed precision guide advises.
        keras.layers.Dense(1, dtype="float32",
                           kernel_initializer=init(seed=3), name="out"),
    ])


def _train(steps: int, epochs: int
           ) -> Tuple[List[Step], float, List[str], Optional[int]]:
    """Fits the model; returns every step's record, the final scale, the
    monitor's lines and the planted step (None if the run was too short)."""
    import keras

    import tf_lossscale

    x, y = _make_data(steps // epochs * BATCH_SIZE)
    opt = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.Adam(1e-3), initial_scale=INITIAL_SCALE,
        dynamic_growth_steps=GROWTH_STEPS)
    history: List[Step] = []
    earliest = steps * 2 // 3  # 0-based, as `iterations` counts.

    class Planter(keras.callbacks.Callback):
        """Sets the planted layer's fault for one step: the first from
        two thirds in that follows an applied step, so that it begins a
        run of skips of its own (the monitor prints one line per run)."""

        step: Optional[int] = None  # 1-based, once planted.

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            plant = (self.step is None and len(history) >= earliest
                     and not history[-1].skipped)
            if plant:
                self.step = len(history) + 1
            self.model.get_layer(PLANTED_LAYER).fault.assign(
                FLOAT16_MAX if plant else 1.0)

    class Recorder(keras.callbacks.Callback):
        """Listed after the monitor, so its `logs` hold the scale and count.

        `logs["loss"]` is the epoch's running mean over its batches (all of
        one size); a batch's own loss is what the running total gained.
        """

        def __init__(self) -> None:
            super().__init__()
            self.scale = INITIAL_SCALE  # The scale the next step uses.
            self.skips = 0

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.epoch, self.total, self.batches = epoch + 1, 0.0, 0

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            logs = logs or {}
            self.batches += 1
            total = float(logs["loss"]) * self.batches
            skips = int(logs["skipped_steps"])
            history.append(Step(len(history) + 1, self.epoch,
                                total - self.total, self.scale,
                                skips > self.skips))
            self.total, self.skips = total, skips
            self.scale = float(logs["loss_scale"])

    # The monitor's lines, printed after the bar (one per run of skips:
    # this demo overflows on purpose every few dozen steps).
    monitor_lines: List[str] = []
    previous_policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = _make_model(keras)
        model.compile(optimizer=opt, loss="mse")
        assert model.optimizer is opt  # Not wrapped a second time.
        planter = Planter()
        model.fit(x, y, batch_size=BATCH_SIZE, epochs=epochs, shuffle=False,
                  callbacks=[planter,
                             tf_lossscale.LossScaleMonitor(
                                 print_fn=monitor_lines.append),
                             Recorder(), _bar(keras, epochs, sys.stdout)],
                  verbose=0)
    finally:
        keras.mixed_precision.set_global_policy(previous_policy)
    if int(opt.iterations) != len(history):
        raise RuntimeError(
            f"iterations is {int(opt.iterations)} after {len(history)} "
            "steps; it must count skipped steps too.")
    return history, float(opt.loss_scale), monitor_lines, planter.step


def _monitor_summary(lines: Sequence[str]) -> str:
    """What LossScaleMonitor said: how often, and its line for the plant."""
    # The planted step's line names that one gradient alone.
    planted = [line for line in lines
               if "1 of 6 gradients non-finite: " in line
               and line.split("non-finite: ")[1].split(";")[0].endswith(
                   f"{PLANTED_LAYER}/kernel")]
    said = (f"LossScaleMonitor named the non-finite gradients of each of "
            f"{len(lines)} runs of skipped steps (opt.last_skip has the "
            "last); ")
    if not planted:
        return said + "the planted overflow did not happen in so few steps."
    return said + "the planted overflow:\n  " + planted[0]


def summary(history: Sequence[Step], final_scale: float) -> str:
    """The closing lines: loss, skipped steps, where the scale settled."""
    epochs = history[-1].epoch
    skipped = sum(s.skipped for s in history)
    last = [s.scale for s in history if s.epoch == epochs] + [final_scale]
    first_loss = np.mean([s.loss for s in history if s.epoch == 1])
    last_loss = np.mean([s.loss for s in history if s.epoch == epochs])
    low, high = min(last), max(last)
    settled = (_power(low) if low == high
               else f"between {_power(low)} and {_power(high)}")
    return "\n".join([
        f"Final loss: {last_loss:.4f} (mean of the last epoch; the first "
        f"epoch's was {first_loss:.4f}).",
        f"Skipped steps: {skipped} of {len(history)} (their float16 "
        "gradients overflowed: not applied, and the scale backed off).",
        f"Loss scale: started at {_power(INITIAL_SCALE)}, settled "
        f"{settled} in the last epoch (now {_power(final_scale)}).",
    ])


def _write_csv(history: Sequence[Step], path: str) -> None:
    with open(path, "w") as f:
        f.write(",".join(CSV_COLUMNS) + "\n")
        f.writelines(f"{s.step},{s.epoch},{s.loss:.6g},{s.scale!r},"
                     f"{int(s.skipped)}\n" for s in history)


def plot(history: Sequence[Step], path: str,
         planted: Optional[int] = None) -> None:
    """Writes the PNG: loss above, loss scale below, one step axis;
    `planted` (a 1-based step) is pointed at as the planted overflow.

    Raises:
      ImportError: matplotlib is not installed.
    """
    _figure(history, planted).savefig(path, dpi=110)


def _figure(history: Sequence[Step], planted: Optional[int]) -> Any:
    from matplotlib.figure import Figure  # No pyplot: no GUI backend.
    from matplotlib.ticker import FuncFormatter

    steps = [s.step for s in history]
    skipped = [s for s in history if s.skipped]
    fig = Figure(figsize=(10, 7), layout="constrained")
    loss_ax, scale_ax = fig.subplots(2, 1, sharex=True)
    fig.suptitle(
        f"Dynamic loss scaling in a mixed_float16 fit: {len(history)} "
        f"steps, {len(skipped)} skipped", fontsize=13)

    loss_ax.plot(steps, [s.loss for s in history], color="tab:blue",
                 linewidth=1.2, label="training loss of the step's batch")
    loss_ax.plot([s.step for s in skipped], [s.loss for s in skipped], "x",
                 color="tab:red", markersize=7, markeredgewidth=1.8,
                 label="skipped step (update not applied)")
    loss_ax.set_yscale("log")
    loss_ax.yaxis.set_major_formatter(FuncFormatter(_plain_number))
    loss_ax.yaxis.set_minor_formatter(FuncFormatter(_sparse_number))
    loss_ax.tick_params(axis="y", which="minor", labelsize=8)
    loss_ax.set_ylabel("loss (mean squared error, log axis)")

    scale_ax.plot(steps, [s.scale for s in history], color="tab:green",
                  linewidth=1.6, drawstyle="steps-mid",
                  label="loss scale used by the step")
    scale_ax.plot([s.step for s in skipped], [s.scale for s in skipped],
                  "x", color="tab:red", markersize=7, markeredgewidth=1.8,
                  label="skipped: float16 gradients overflowed, scale "
                  "halved")
    scale_ax.set_yscale("log", base=2)
    scale_ax.set_ylabel("loss scale (log2 axis)")
    scale_ax.set_xlabel("training step")
    scale_ax.set_xlim(0.5, len(history) + 0.5)

    _mark_epochs(history, loss_ax, scale_ax)
    _annotate_scale(history, scale_ax)
    if planted is not None:
        _annotate_planted(history[planted - 1], scale_ax)
    for ax in (loss_ax, scale_ax):
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(loc="upper right", fontsize=9, framealpha=0.9)
    return fig


def _plain_number(value: float, _: Any = None) -> str:
    return f"{value:g}"


def _sparse_number(value: float, _: Any = None) -> str:
    """A minor tick's label on a log axis: only at 2, 3 and 5 times 10^k."""
    if value <= 0:
        return ""
    leading = round(value / 10 ** math.floor(math.log10(value)))
    return f"{value:g}" if leading in (2, 3, 5) else ""


def _mark_epochs(history: Sequence[Step], *axes: Any) -> None:
    """Dashed lines between epochs, and each epoch's number on top."""
    starts = [s.step for s, before in zip(history[1:], history)
              if s.epoch != before.epoch]
    edges = [0.5] + [b - 0.5 for b in starts] + [len(history) + 0.5]
    for ax in axes:
        for n, edge in enumerate(edges[1:-1]):
            ax.axvline(edge, color="0.45", linestyle="--", linewidth=1,
                       label="epoch boundary" if n == 0 else None)
    top = axes[0]
    for n, (left, right) in enumerate(zip(edges, edges[1:]), start=1):
        top.text((left + right) / 2, 1.01, f"epoch {n}", ha="center",
                 va="bottom", fontsize=9, color="0.3",
                 transform=top.get_xaxis_transform())


def _annotate_scale(history: Sequence[Step], ax: Any) -> None:
    """Points at the first back-offs and at the first growth."""
    first_kept = next((s for s in history if not s.skipped), None)
    if first_kept is not None and first_kept.step > 1:
        ax.annotate(
            f"starts at {_power(INITIAL_SCALE)}: overflow, skip, halve\n"
            "until the gradients fit", xy=(1, INITIAL_SCALE),
            xytext=(0.12, 0.85), textcoords="axes fraction", fontsize=9,
            arrowprops={"arrowstyle": "->", "color": "0.3"})
    growth = next((s for s, before in zip(history[1:], history)
                   if s.scale > before.scale), None)
    if growth is None:
        return
    ax.annotate(
        f"doubles after {GROWTH_STEPS} good steps in a row",
        xy=(growth.step, growth.scale), xytext=(0.3, 0.12),
        textcoords="axes fraction", fontsize=9,
        arrowprops={"arrowstyle": "->", "color": "0.3"})
    again = next((s for s in history if s.skipped and s.step > growth.step),
                 None)
    if again is not None:
        ax.annotate(
            "too high again: overflow, skip, halve\n(the saw-tooth of "
            "dynamic loss scaling)", xy=(again.step, again.scale),
            xytext=(0.3, 0.62), textcoords="axes fraction", fontsize=9,
            arrowprops={"arrowstyle": "->", "color": "0.3"})


def _annotate_planted(step: Step, ax: Any) -> None:
    """Points at the planted overflow, the step the printed line names."""
    ax.annotate(
        f"planted: {PLANTED_LAYER}'s gradient overflows\n(the monitor's "
        "printed line names the layer)", xy=(step.step, step.scale),
        xytext=(0.66, 0.12), textcoords="axes fraction", fontsize=9,
        arrowprops={"arrowstyle": "->", "color": "0.3"})


def _epochs(steps: int) -> int:
    """The most epochs, up to 4, that split `steps` evenly."""
    return next(e for e in (4, 3, 2, 1) if steps % e == 0)


def run(steps: Optional[int] = None, out_dir: str = "demo_out") -> int:
    """Runs the demo; returns the exit code (0, or 2 for a bad count)."""
    steps = DEFAULT_STEPS if steps is None else steps
    if steps < 1:
        print(f"--steps must be a positive number of steps; got {steps}.")
        return 2
    print(_intro(), flush=True)
    history, final_scale, monitor_lines, planted = _train(steps,
                                                          _epochs(steps))
    print(summary(history, final_scale))
    print(_monitor_summary(monitor_lines))
    os.makedirs(out_dir, exist_ok=True)
    csv_path = os.path.join(out_dir, CSV_NAME)
    _write_csv(history, csv_path)
    try:
        import matplotlib  # noqa: F401  (the optional extra)
    except ImportError:
        print(f"Wrote {csv_path} (loss, loss scale and skipped flag per "
              f"step). No plot: matplotlib is not installed; "
              f"{INSTALL_HINT} adds it.")
        return 0
    png_path = os.path.join(out_dir, PNG_NAME)
    plot(history, png_path, planted)
    print(f"Wrote {png_path} (plot) and {csv_path} (loss, loss scale and "
          "skipped flag per step).")
    return 0
