"""One ParameterServerStrategy run with a custom loop, in-process cluster.

`python tests/_parameter_server_case.py keras3|tf_keras` starts two workers
and a parameter server on 127.0.0.1 (free ports) in this process, trains a
variable with tf_lossscale's LossScaleOptimizer for three steps of which the
second has a NaN gradient, and prints what it ended with as one JSON line.
tf_keras needs TF_USE_LEGACY_KERAS=1, which this script sets before
TensorFlow is imported.
"""

import json
import os
import socket
import sys

FLAVOUR = sys.argv[1]
if FLAVOUR == "tf_keras":
    os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_lossscale  # noqa: E402


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def make_optimizer():
    if FLAVOUR == "tf_keras":
        import tf_keras
        inner = tf_keras.optimizers.SGD(0.1, momentum=0.5)
    else:
        import keras
        inner = keras.optimizers.SGD(0.1, momentum=0.5)
    return tf_lossscale.LossScaleOptimizer(inner, initial_scale=1024,
                                           dynamic_growth_steps=2)


def main():
    ports = free_ports(3)
    cluster = tf.train.ClusterSpec({
        "worker": [f"127.0.0.1:{ports[0]}", f"127.0.0.1:{ports[1]}"],
        "ps": [f"127.0.0.1:{ports[2]}"]})
    servers = [tf.distribute.Server(cluster, job_name=job, task_index=index,
                                    protocol="grpc", start=True)
               for job, index in [("worker", 0), ("worker", 1), ("ps", 0)]]
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        cluster, rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(
        strategy)
    with strategy.scope():
        var = tf.Variable([1.0, 2.0])
        opt = make_optimizer()
        if FLAVOUR == "keras3":
            opt.build([var])  # slots made on the parameter servers

    @tf.function
    def train_step(x):
        def step_fn(x):
            with tf.GradientTape() as tape:
                loss = opt.get_scaled_loss(tf.reduce_sum(var * x))
            grads = opt.get_unscaled_gradients(tape.gradient(loss, [var]))
            opt.apply_gradients(zip(grads, [var]))
        strategy.run(step_fn, args=(x,))

    trajectory = []
    for x in ([1.0, 1.0], [np.nan, 1.0], [1.0, 1.0], [1.0, 1.0]):
        coordinator.schedule(train_step, args=(tf.constant(x),))
        coordinator.join()
        trajectory.append({"var": var.numpy().tolist(),
                           "scale": float(opt.loss_scale),
                           "iterations": int(opt.iterations.numpy())})
    print(json.dumps({"trajectory": trajectory,
                      "workers": len(servers) - 1,
                      "class": type(opt).__name__,
                      "skipped": int(opt.skipped_steps)}))


if __name__ == "__main__":
    main()
