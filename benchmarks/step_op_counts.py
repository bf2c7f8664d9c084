"""Op counts of one traced step of ours, to compare two trees of the code.

    PYTHONPATH=TREE python benchmarks/step_op_counts.py keras3|tf_keras

Traces a custom-loop step of a 7 x Dense(16) MLP (SGD and Adam; Keras 3's
`scale_loss` flow and TensorFlow's documented flow; without XLA and with
`jit_compile=True`) and prints, as JSON, the graph's op count (every
function body included) or the optimized HLO's instructions, fusions,
copies and conditionals. These are deterministic: a change that leaves them
equal on two trees leaves the step's cost as it was, whatever the load
(a refactoring's proof of neutrality, with no timing noise).
"""
import collections
import json
import os
import re
import sys

LEGACY = sys.argv[1] == "tf_keras"
if LEGACY:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import tensorflow as tf  # noqa: E402

if LEGACY:
    import tf_keras as keras  # noqa: E402
else:
    import keras  # noqa: E402
import tf_lossscale  # noqa: E402

print(tf_lossscale.__file__, file=sys.stderr)

def graph_ops(concrete):
    """Ops of a traced function, every function body in its library included."""
    graph = concrete.graph.as_graph_def()
    ops = collections.Counter(n.op for n in graph.node)
    for function in graph.library.function:
        ops.update(n.op for n in function.node_def)
    return sum(ops.values())


def hlo_counts(hlo):
    """Instructions of an optimized HLO module, and some kinds of them."""
    lines = [line for line in hlo.splitlines() if " = " in line]
    kinds = collections.Counter(
        m.group(1) for m in (re.search(r" ([\w-]+)\(", line.split(" = ", 1)[1])
                             for line in lines) if m)
    return {"hlo_instructions": len(lines),
            "conditional": kinds.get("conditional", 0),
            "copy": kinds.get("copy", 0), "fusion": kinds.get("fusion", 0)}


def make_step(model, opt, flow):
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
            if flow == "keras" and not LEGACY:
                scaled = opt.scale_loss(loss)
            else:
                scaled = opt.get_scaled_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        if flow == "documented":
            grads = opt.get_unscaled_gradients(grads)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    return step


def count(optimizer, flow, xla, x, y):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((16,))]
        + [keras.layers.Dense(16, activation="relu") for _ in range(6)]
        + [keras.layers.Dense(1)])
    opt = tf_lossscale.LossScaleOptimizer(
        getattr(keras.optimizers, optimizer)(1e-3))
    step = tf.function(make_step(model, opt, flow), jit_compile=xla)
    step(x, y)
    if xla:
        return hlo_counts(
            step.experimental_get_compiler_ir(x, y)(stage="optimized_hlo"))
    return {"graph_ops": graph_ops(step.get_concrete_function(x, y))}


def main():
    x, y = tf.random.normal([8, 16]), tf.random.normal([8, 1])
    out = {}
    for optimizer in ("SGD", "Adam"):
        for flow in ("keras", "documented"):
            for xla in (False, True):
                key = f"{optimizer}/{flow}/{'xla' if xla else 'graph'}"
                out[key] = count(optimizer, flow, xla, x, y)
                print(key, out[key], file=sys.stderr)
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
