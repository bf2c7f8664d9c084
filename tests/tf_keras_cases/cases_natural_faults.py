"""The skip record on natural faults in real tf_keras `fit` runs.

Runs under TF_USE_LEGACY_KERAS=1 (see tests/_tf_keras_cases.py); the
models are `_natural_faults.py`'s, as in `test_skip_record_natural.py`.
"""

from __future__ import annotations

import _natural_faults as nf
import pytest
import tensorflow as tf
import tf_keras

import tf_lossscale
from tf_lossscale import deep_look

JIT = pytest.mark.parametrize("jit_compile", [False, True],
                              ids=["graph", "jit_compile"])


def _fit(model, x, y, scale, jit_compile, loss="mse"):
    return nf.fit(tf_keras, tf_lossscale.LossScaleMonitor,
                  tf_lossscale.LossScaleOptimizer, model, x, y,
                  initial_scale=scale, jit_compile=jit_compile, loss=loss)


@JIT
def test_a_deep_mlp_at_a_huge_scale_names_l11_backward_inf(jit_compile):
    opt, monitor = _fit(nf.deep_mlp(tf_keras), *nf.data(), 2.0**30,
                        jit_compile)
    record = opt.last_skip
    assert (nf.last_part(record.source), record.origin, record.source_kind,
            record.loss) == ("l11", "backward", "Inf", "finite")
    assert (record.count, record.total) == (24, 26)
    assert record.farthest.endswith("l0/kernel")
    print(monitor.lines[0])
    assert monitor.lines[0].startswith(
        "step 0 skipped on replica 0: Inf entered at ")
    assert "l11 in the backward pass (the loss was finite); 24 of 26 " \
        "gradients non-finite, " in monitor.lines[0]


@JIT
def test_a_residual_model_names_the_branch_layer_that_overflowed(
        jit_compile):
    opt, _ = _fit(nf.residual(tf_keras), *nf.data(), 2.0**10, jit_compile)
    record = opt.last_skip
    # Inside branch a (TF 2.16's XLA: at a1, through the x1000), never b1.
    assert nf.last_part(record.source) in ("a1", "a2")
    assert record.origin == "backward"
    assert not [n for n in record.names if "b1/" in n or "out/" in n]
    # Under XLA the check's kinds tell no "NaN and Inf" from "NaN".
    assert record.source_kind == "Inf" or jit_compile


@JIT
def test_attention_logits_overflowing_float16_name_the_forward_pass(
        jit_compile):
    x, y = nf.data()
    opt, _ = _fit(nf.attention(tf_keras), x.reshape(-1, 4, 2), y, 2.0**10,
                  jit_compile)
    record = opt.last_skip
    assert (record.loss, record.origin, record.source_kind) == (
        "NaN", "forward", "NaN")
    assert nf.last_part(record.source) == "out"


@JIT
def test_a_log_of_zero_in_the_loss_names_the_forward_pass_and_inf(
        jit_compile):
    opt, _ = _fit(nf.small_mlp(tf_keras, zero_output=True), *nf.data(),
                  2.0**10, jit_compile, loss=nf.log_loss)
    record = opt.last_skip
    assert (record.loss, record.origin, record.first_step) == (
        "Inf", "forward", 0)


@JIT
def test_a_nan_in_the_input_batch_names_the_forward_pass(jit_compile):
    opt, monitor = _fit(nf.small_mlp(tf_keras), *nf.data(nan_row=20),
                        2.0**10, jit_compile)
    record = opt.last_skip
    assert (record.step, record.loss, record.origin) == (1, "NaN", "forward")
    assert nf.last_part(record.source) == "out"
    print(monitor.lines[0])


def test_the_deep_look_names_the_attention_logits_forward():
    x, y = nf.data()
    model = nf.attention(tf_keras)
    inputs = tf.constant(x[:nf.BATCH].reshape(-1, 4, 2))
    found = deep_look.first_nonfinite_op(
        lambda: tf.reduce_mean(model(inputs) - y[:nf.BATCH]),
        model.trainable_variables, 2.0**10)
    assert (found.backward, found.dtype) == (False, "float16")
    assert "attend" in found.op, found
