"""Two-worker mixed-precision training with tf_lossscale's LossScaleOptimizer.

Run it as it is; it starts two workers on this machine (127.0.0.1, free
ports) and prints what each ended with:

    python examples/multiworker.py

On a real cluster, start one copy per machine with `TF_CONFIG` set for that
machine and pass `--worker`; that is the code path each local worker runs.
Worker 1 reads a NaN at step `--nan-step` (default 3) on purpose: both
workers skip that step together, halve the loss scale, and finish with the
same weights. With Keras 3's own LossScaleOptimizer worker 0 would wait
forever in the gradient all-reduce that worker 1 skipped.
"""

import argparse
import hashlib
import json
import os
import socket
import subprocess
import sys

PER_WORKER_BATCH = 8


def train(steps: int, nan_step: int) -> None:
    """One worker's run; `TF_CONFIG` says which worker this is."""
    import numpy as np
    import tensorflow as tf
    import keras
    import tf_lossscale

    task_id = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy("mixed_float16")
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((4,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(1),
            keras.layers.Activation("linear", dtype="float32"),
        ])
        optimizer = tf_lossscale.LossScaleOptimizer(
            keras.optimizers.Adam(1e-3), initial_scale=2.0**12,
            dynamic_growth_steps=100)

    def dataset_fn(input_context):
        # Each worker makes its own shard of the data.
        rng = np.random.default_rng(input_context.input_pipeline_id)
        x = rng.normal(size=(steps * PER_WORKER_BATCH, 4)).astype("float32")
        if input_context.input_pipeline_id == 1:
            x[nan_step * PER_WORKER_BATCH] = np.nan  # a bad record
        y = x.sum(axis=1, keepdims=True)
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(
            PER_WORKER_BATCH)

    dataset = strategy.distribute_datasets_from_function(dataset_fn)
    global_batch = PER_WORKER_BATCH * strategy.num_replicas_in_sync

    def step_fn(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(model(x) - y)) / global_batch
            scaled_loss = optimizer.get_scaled_loss(loss)
        scaled_grads = tape.gradient(scaled_loss, model.trainable_variables)
        grads = optimizer.get_unscaled_gradients(scaled_grads)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    @tf.function
    def train_step(batch):
        strategy.run(step_fn, args=batch)

    @tf.function
    def barrier():
        return strategy.reduce(
            "SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)

    for batch in dataset:
        train_step(batch)
    # End with one last collective, so no worker exits while its peer still
    # needs it (the peer would fail with "tasks are unhealthy").
    barrier()

    digest = hashlib.sha256(
        b"".join(w.tobytes() for w in model.get_weights())).hexdigest()
    print(f"worker {task_id}: loss scale {float(optimizer.loss_scale)}, "
          f"iterations {int(optimizer.iterations.numpy())}, "
          f"weights sha256 {digest[:16]}", flush=True)


def free_ports(count: int) -> list:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def launch_local_workers(argv: list, timeout: float) -> int:
    """Starts two workers of this script on 127.0.0.1; returns 0 if both end
    cleanly with the same weights."""
    workers = [f"127.0.0.1:{p}" for p in free_ports(2)]
    procs = []
    for index in range(2):
        config = {"cluster": {"worker": workers},
                  "task": {"type": "worker", "index": index}}
        env = dict(os.environ, TF_CONFIG=json.dumps(config),
                   TF_CPP_MIN_LOG_LEVEL="2")
        procs.append(subprocess.Popen(
            [sys.executable, __file__, "--worker", *argv], env=env,
            stdout=subprocess.PIPE, text=True))
    outputs = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            print(f"a worker did not finish within {timeout:.0f} s")
            return 1
        outputs.append(out.strip().splitlines()[-1] if out.strip() else "")
        print(outputs[-1])
    if any(p.returncode for p in procs):
        return 1
    hashes = {line.rsplit(" ", 1)[-1] for line in outputs}
    return 0 if len(hashes) == 1 else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true",
                        help="run one worker (TF_CONFIG must be set)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--nan-step", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    if args.worker:
        train(args.steps, args.nan_step)
        return 0
    return launch_local_workers(
        ["--steps", str(args.steps), "--nan-step", str(args.nan_step)],
        args.timeout)


if __name__ == "__main__":
    sys.exit(main())
