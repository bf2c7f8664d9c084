"""A training process for `tests/test_resume.py` to kill and restart.

Trains a small `mixed_float16` Keras 3 model with
`tf_lossscale.LossScaleOptimizer` through `train_on_batch`, one batch per
step, the batch a function of the step number (NaN at `NAN_STEPS`, so the
scale and counter move both ways). Every `--every` steps it saves either a
`tf.train.Checkpoint` of model and optimizer or a `.keras` file. Started
again on the same directory, it restores the newest save and carries on
from the optimizer's `iterations`. `--stall-after K` makes it stop (sleep)
after printing "step K done", for the test to SIGKILL it there. At the end
it writes the exact state to `--out` (JSON):

    python tests/_resume_worker.py --format checkpoint --dir /tmp/run \
        --steps 24 --every 5 --out /tmp/final.json
"""

import argparse
import glob
import hashlib
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_lossscale  # noqa: E402

NAN_STEPS = (3, 11, 16)
BATCH = 8


def batch(step):
    """The batch of `step`: the same in every process."""
    rng = np.random.default_rng(1000 + step)
    x = rng.normal(size=(BATCH, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    if step in NAN_STEPS:
        x[0, 0] = np.nan
    return x, y


def new_model():
    model = keras.Sequential([
        keras.Input((4,)),
        keras.layers.Dense(8, activation="relu"),
        keras.layers.Dense(1),
        keras.layers.Activation("linear", dtype="float32"),
    ])
    optimizer = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.Adam(0.01), initial_scale=2.0**10,
        dynamic_growth_steps=4)
    model.compile(optimizer=optimizer, loss="mse", jit_compile=False)
    optimizer.build(model.trainable_variables)
    return model


class CheckpointSaves:
    """`tf.train.Checkpoint` of model and optimizer, newest restored."""

    def __init__(self, directory):
        self.directory = directory

    def load(self):
        model = new_model()
        self.checkpoint = tf.train.Checkpoint(
            model=model, optimizer=model.optimizer)
        self.manager = tf.train.CheckpointManager(
            self.checkpoint, self.directory, max_to_keep=2)
        if self.manager.latest_checkpoint:
            self.checkpoint.restore(
                self.manager.latest_checkpoint).assert_consumed()
            return model, self.manager.latest_checkpoint
        return model, None

    def save(self, model, step):
        del model  # The checkpoint tracks it.
        self.manager.save(checkpoint_number=step)


class KerasFileSaves:
    """`model.save(...keras)`, written under a temporary name then renamed,
    so a kill never leaves a torn file; the newest one is loaded."""

    def __init__(self, directory):
        self.directory = directory

    def _files(self):
        found = glob.glob(os.path.join(self.directory, "model_*.keras"))
        return sorted(found, key=lambda p: int(p.rsplit("_", 1)[1][:-6]))

    def load(self):
        files = self._files()
        if not files:
            return new_model(), None
        return keras.models.load_model(files[-1]), files[-1]

    def save(self, model, step):
        final = os.path.join(self.directory, f"model_{step}.keras")
        partial = os.path.join(self.directory, f"partial_{step}.keras")
        model.save(partial)
        os.replace(partial, final)


def state(model):
    """What the test compares: exact bytes of weights and slots, scale,
    counter and iterations."""
    optimizer = model.optimizer
    weights = [np.asarray(w) for w in model.get_weights()]
    slots = [np.asarray(v) for v in optimizer.inner_optimizer.variables]
    return {
        "weights": [hashlib.sha256(w.tobytes()).hexdigest() for w in weights],
        "slots": [hashlib.sha256(s.tobytes()).hexdigest() for s in slots],
        "scale": float(tf.convert_to_tensor(optimizer.loss_scale)),
        "counter": int(tf.convert_to_tensor(optimizer.dynamic_counter)),
        "iterations": int(tf.convert_to_tensor(optimizer.iterations)),
        "optimizer_class": type(optimizer).__name__,
    }


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", choices=["checkpoint", "keras"],
                        required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--stall-after", type=int, default=-1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    tf.config.experimental.enable_op_determinism()
    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy("mixed_float16")
    os.makedirs(args.dir, exist_ok=True)
    saves = (CheckpointSaves if args.format == "checkpoint"
             else KerasFileSaves)(args.dir)
    model, restored_from = saves.load()
    start = int(tf.convert_to_tensor(model.optimizer.iterations))
    print(f"start at step {start} from {restored_from}", flush=True)
    for step in range(start, args.steps):
        model.train_on_batch(*batch(step))
        if (step + 1) % args.every == 0:
            saves.save(model, step + 1)
        print(f"step {step} done", flush=True)
        if step == args.stall_after:
            time.sleep(600)  # Killed here by the test.
    with open(args.out, "w") as f:
        json.dump(state(model), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
