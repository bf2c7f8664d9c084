"""One worker of the two-worker `MultiWorkerMirroredStrategy` tests.

Started by `tests/test_multiworker.py` with `TF_CONFIG` naming two workers on
127.0.0.1. Trains a small `mixed_float16` Keras 3 model, through `model.fit`
or a custom `strategy.run` loop, with a loss-scale optimizer, on data that
holds a NaN at step `--nan-step` on worker `--nan-worker` only. Writes what
the test compares to `--out` (JSON): the scale, counter and iterations, an
exact hash of the weight bytes, and the same after every step.

    python tests/_multiworker_worker.py --optimizer ours --mode fit \
        --steps 6 --nan-step 3 --nan-worker 1 --out /tmp/w0.json
"""

import argparse
import hashlib
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

PER_WORKER_BATCH = 4
FEATURES = 3


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--optimizer", choices=["ours", "keras", "plain"],
                        required=True)
    parser.add_argument("--mode", choices=["fit", "loop"], required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--nan-step", type=int, default=-1,
                        help="0-based step whose batch holds a NaN")
    parser.add_argument("--nan-worker", type=int, default=1)
    parser.add_argument("--collective-timeout", type=float, default=30.0,
                        help="seconds a collective may wait for its peer")
    parser.add_argument("--out", required=True)
    return parser.parse_args(argv)


def worker_rows(task_id, steps, nan_step, nan_worker):
    """This worker's rows, features then target: distinct per worker.

    The first feature of the first row of step `nan_step` is NaN on worker
    `nan_worker`, so only that worker's gradients are NaN at that step.
    """
    n = steps * PER_WORKER_BATCH
    grid = np.arange(n * FEATURES, dtype=np.float32).reshape(n, FEATURES)
    x = np.sin(grid + 7.0 * task_id)
    y = x.sum(axis=1, keepdims=True) * 0.5
    if task_id == nan_worker and 0 <= nan_step < steps:
        x[nan_step * PER_WORKER_BATCH, 0] = np.nan
    return np.concatenate([x, y], axis=1).astype(np.float32)


def make_dataset(strategy, task_id, args):
    rows = worker_rows(task_id, args.steps, args.nan_step, args.nan_worker)

    def dataset_fn(input_context):
        assert input_context.num_input_pipelines == 2, input_context
        return tf.data.Dataset.from_tensor_slices(rows).batch(
            PER_WORKER_BATCH)

    return strategy.distribute_datasets_from_function(dataset_fn)


def make_optimizer(kind):
    inner = keras.optimizers.SGD(learning_rate=0.05, momentum=0.9)
    if kind == "ours":
        import tf_lossscale
        return tf_lossscale.LossScaleOptimizer(
            inner, initial_scale=2.0**10, dynamic_growth_steps=2)
    if kind == "keras":
        return keras.mixed_precision.LossScaleOptimizer(
            inner, initial_scale=2.0**10, dynamic_growth_steps=2)
    return inner


class PackedModel(keras.Model):
    """A two-layer regressor fed `features | target` as ONE tensor.

    Two work-arounds for Keras 3.15's `fit` under `MultiWorkerMirroredStrategy`
    (keras-team/keras#20585), unrelated to loss scaling:
    - its symbolic build calls `strategy.reduce` on the `(x, y)` tuple and
      fails; a single-tensor batch avoids that, so the target travels in the
      last column and `compute_loss` takes it from there;
    - it reduces the step's logs with `strategy.reduce("MEAN", v, axis=0)`,
      which fails on scalars; `get_metrics_result` gives them one axis.
    """

    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(4, activation="tanh")
        self.out = keras.layers.Dense(1)

    def build(self, input_shape):
        self.hidden.build((None, FEATURES))
        self.out.build((None, 4))

    def call(self, packed):
        hidden = self.hidden(packed[:, :FEATURES])
        return tf.cast(self.out(hidden), tf.float32)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None,
                     training=True):
        return super().compute_loss(
            x=x, y=x[:, FEATURES:], y_pred=y_pred,
            sample_weight=sample_weight, training=training)

    def get_metrics_result(self):
        return {name: tf.reshape(value, [1])
                for name, value in super().get_metrics_result().items()}


def build_model():
    model = PackedModel()
    model.build((None, FEATURES + 1))
    return model


def number(value):
    """A scalar tensor or variable as a Python number."""
    return tf.convert_to_tensor(value).numpy().item()


def scale_state(optimizer, kind):
    """(scale, counter) of the optimizer as Python numbers."""
    if kind == "ours":
        return number(optimizer.loss_scale), number(optimizer.dynamic_counter)
    if kind == "keras":
        return number(optimizer.dynamic_scale), number(optimizer.step_counter)
    return 1.0, 0


def weights_hash(model):
    digest = hashlib.sha256()
    for w in model.get_weights():
        digest.update(np.ascontiguousarray(w).tobytes())
    return digest.hexdigest()


def snapshot(model, optimizer, kind):
    scale, counter = scale_state(optimizer, kind)
    return {"scale": scale, "counter": counter,
            "iterations": number(optimizer.iterations),
            "weights": weights_hash(model)}


class History(keras.callbacks.Callback):
    """Records a snapshot after every `fit` step."""

    def __init__(self, optimizer, kind):
        super().__init__()
        self.snapshots = []
        self._optimizer = optimizer
        self._kind = kind

    def on_train_batch_end(self, batch, logs=None):
        self.snapshots.append(snapshot(self.model, self._optimizer,
                                       self._kind))
        print(f"step {batch} done", flush=True)


MONITOR_LINES = []  # What LossScaleMonitor printed (ours, fit).


def train_fit(strategy, model, optimizer, dataset, args):
    with strategy.scope():
        model.compile(optimizer=optimizer, loss="mse", jit_compile=False)
    history = History(optimizer, args.optimizer)
    callbacks = [history]
    if args.optimizer == "ours":
        import tf_lossscale
        callbacks.append(tf_lossscale.LossScaleMonitor(
            print_fn=MONITOR_LINES.append))
    model.fit(dataset, epochs=1, steps_per_epoch=args.steps, verbose=0,
              callbacks=callbacks)
    return history.snapshots


def skip_report(optimizer, kind):
    """What `last_skip` says after the run (ours only)."""
    if kind != "ours" or optimizer.last_skip is None:
        return {}
    record = optimizer.last_skip
    return {"last_skip": str(record), "skip_worker": record.worker,
            "skip_replica": record.replica, "skip_names": list(record.names),
            "monitor_lines": MONITOR_LINES}


def train_loop(strategy, model, optimizer, dataset, args):
    global_batch = PER_WORKER_BATCH * strategy.num_replicas_in_sync

    def step_fn(packed):
        with tf.GradientTape() as tape:
            pred = model(packed, training=True)
            error = pred - packed[:, FEATURES:]
            loss = tf.reduce_sum(tf.square(error)) / global_batch
            scaled = optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def train_step(iterator):
        per_replica = strategy.run(step_fn, args=(next(iterator),))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica,
                               axis=None)

    iterator = iter(dataset)
    snapshots = []
    for _ in range(args.steps):
        train_step(iterator)
        snapshots.append(snapshot(model, optimizer, args.optimizer))
        print(f"step {len(snapshots) - 1} done", flush=True)
    return snapshots


def final_barrier(strategy):
    """One last collective, so neither worker exits while its peer needs it."""
    ones = strategy.run(lambda: tf.constant(1.0))
    return float(strategy.reduce(tf.distribute.ReduceOp.SUM, ones, axis=None))


def main(argv):
    args = parse_args(argv)
    task_id = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    communication = tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=args.collective_timeout)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=communication)
    keras.config.disable_traceback_filtering()
    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy("mixed_float16")
    with strategy.scope():
        model = build_model()
        optimizer = make_optimizer(args.optimizer)
    dataset = make_dataset(strategy, task_id, args)
    train = train_fit if args.mode == "fit" else train_loop
    snapshots = train(strategy, model, optimizer, dataset, args)
    workers = final_barrier(strategy)
    result = dict(snapshot(model, optimizer, args.optimizer),
                  task_id=task_id, workers=workers, history=snapshots,
                  **skip_report(optimizer, args.optimizer))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"worker {task_id} done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
