"""Under XLA the check is traced once per gradient signature.

Tracing is what a first call under `jit_compile=True` mostly pays for (each
op costs TensorFlow some 600 Python calls), and a step is traced again for
a smaller last batch. The verdict (`finite_xla._checked`: the sums, the
exact branch, the kinds) is a `tf.function` of the gradients, so a trace
with the same gradient shapes reuses its graph.
"""

from __future__ import annotations

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_lossscale
from tf_lossscale import finite_xla

# Shapes no other test uses, so the counts start from this file's traces.
_SHAPES = [(7, 11), (13,), (7, 11)]


def _traces() -> int:
    return finite_xla._checked.experimental_get_tracing_count()


def test_a_second_step_function_with_the_same_gradients_reuses_the_check():
    opt = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    variables = [keras.Variable(np.ones(s, "float32")) for s in _SHAPES]
    opt.build(variables)
    specs = [tf.TensorSpec(s) for s in _SHAPES]

    def traced(shapes_specs):
        step = tf.function(lambda grads: opt.apply(grads, variables),
                           jit_compile=True)
        return step.get_concrete_function(shapes_specs)

    before = _traces()
    first = traced(specs)
    assert _traces() == before + 1
    second = traced(specs)
    assert _traces() == before + 1  # reused, not traced again
    # Both steps call it: one function in each library, one call each.
    for concrete in (first, second):
        names = [f.signature.name for f in
                 concrete.graph.as_graph_def().library.function]
        assert sum("_checked" in n for n in names) == 1, names
    # Another signature is another trace.
    other = [tf.TensorSpec(s, tf.float32) for s in [(7, 11), (13,), (11, 7)]]
    variables[2] = keras.Variable(np.ones((11, 7), "float32"))
    opt2 = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    opt2.build(variables)
    tf.function(lambda grads: opt2.apply(grads, variables),
                jit_compile=True).get_concrete_function(other)
    assert _traces() == before + 2


def test_a_step_traced_again_for_a_smaller_batch_traces_the_check_once():
    """A smaller last batch traces the step again, with the same gradient
    shapes: the check is traced once, and the step still trains (the first
    step's values are the plain optimizer's)."""
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(9),
                              keras.layers.Dense(9), keras.layers.Dense(3)])
    opt = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(0.1),
                                          initial_scale=2.0**10)
    x = tf.constant(np.linspace(-1, 1, 20, dtype="float32").reshape(4, 5))
    traced = []

    @tf.function(jit_compile=True)
    def step(batch):
        traced.append(1)
        with tf.GradientTape() as tape:
            scaled = opt.scale_loss(tf.reduce_sum(model(batch) ** 2))
        grads = tape.gradient(scaled, model.trainable_variables)
        opt.apply(grads, model.trainable_variables)

    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(x) ** 2)
    want = [v.numpy() - 0.1 * g.numpy() for v, g in zip(
        model.trainable_variables,
        tape.gradient(loss, model.trainable_variables))]
    initial = [v.numpy() for v in model.trainable_variables]
    before = _traces()
    step(x)
    # XLA sums the matmuls' gradients in its own order, so a value may
    # differ from eager's by some ulps (1.7e-7 seen on TF 2.16); the step
    # must still move each variable by three orders more than the tolerance.
    for w, v, v0 in zip(want, model.trainable_variables, initial):
        np.testing.assert_allclose(v.numpy(), w, rtol=1e-5, atol=1e-6)
        assert np.max(np.abs(v.numpy() - v0)) > 1e-3
    step(x[:3])
    assert len(traced) == 2
    assert _traces() == before + 1
    assert int(opt.iterations.numpy()) == 2


@pytest.mark.skipif(os.environ.get("TF_USE_LEGACY_KERAS") == "1",
                    reason="tf_keras runs in its own process below")
def test_tf_keras_documented_loop_retraced_traces_the_check_once():
    """The documented flow (`get_scaled_loss`, `get_unscaled_gradients`,
    `apply_gradients`) in tf_keras: its first call is traced once (the
    slots are made eagerly), a smaller last batch traces it again, and the
    check is traced once for both."""
    import subprocess
    import sys
    program = r'''
import os
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import numpy as np, tensorflow as tf, tf_keras
import tf_lossscale
from tf_lossscale import finite_xla
model = tf_keras.Sequential([tf_keras.Input((6,)), tf_keras.layers.Dense(17),
                             tf_keras.layers.Dense(17), tf_keras.layers.Dense(2)])
opt = tf_lossscale.LossScaleOptimizer(tf_keras.optimizers.SGD(0.1, momentum=0.5))
traces = []
@tf.function(jit_compile=True)
def step(x):
    traces.append(1)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(x) ** 2)
        scaled = opt.get_scaled_loss(loss)
    grads = opt.get_unscaled_gradients(
        tape.gradient(scaled, model.trainable_variables))
    opt.apply_gradients(zip(grads, model.trainable_variables))
before = finite_xla._checked.experimental_get_tracing_count()
step(tf.ones([3, 6])); step(tf.ones([3, 6])); step(tf.ones([2, 6]))
print(len(traces), finite_xla._checked.experimental_get_tracing_count() - before,
      int(opt.iterations.numpy()))
'''
    out = subprocess.run([sys.executable, "-c", program], capture_output=True,
                         text=True, check=True,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert out.stdout.split() == ["2", "1", "3"], out.stderr[-2000:]
