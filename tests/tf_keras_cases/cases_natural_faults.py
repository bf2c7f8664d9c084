"""The skip record on natural faults in real tf_keras `fit` runs.

Runs under TF_USE_LEGACY_KERAS=1 (see tests/_tf_keras_cases.py); the
models are `_natural_faults.py`'s, as in `test_skip_record_natural.py`.
"""

from __future__ import annotations

import _natural_faults as nf
import numpy as np
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


@JIT
def test_a_conv_net_at_a_huge_scale_names_c3_backward(jit_compile):
    """As under Keras 3: c3's gradients hold NaN only (Inf x 0, Inf - Inf
    in each filter's sum); the deep look names the Inf's op."""
    x, y = nf.data()
    opt, monitor = _fit(nf.conv(tf_keras), nf.images(x), y, 2.0**30,
                        jit_compile)
    record = opt.last_skip
    assert (record.source, record.origin, record.loss, record.source_kind
            ) == ("c3", "backward", "finite", "NaN")
    assert (record.count, record.total) == (8, 10)
    assert monitor.lines[0] == (
        "step 0 skipped on replica 0: NaN entered at c3 in the backward "
        "pass (the loss was finite); 8 of 10 gradients non-finite, "
        "c3 .. c0; scale 2^30 -> 2^29")


@JIT
def test_an_lstm_at_a_huge_scale_names_lstm1_backward(jit_compile):
    x, y = nf.data()
    opt, monitor = _fit(nf.lstm(tf_keras), nf.sequences(x), y, 2.0**30,
                        jit_compile)
    record = opt.last_skip
    assert (record.source, record.origin, record.loss, record.source_kind
            ) == ("lstm1/lstm_cell", "backward", "finite", "NaN")
    assert (record.count, record.total) == (6, 8)
    assert monitor.lines[0] == (
        "step 0 skipped on replica 0: NaN entered at lstm1/lstm_cell in the "
        "backward pass (the loss was finite); 6 of 8 gradients non-finite, "
        "lstm1/lstm_cell .. lstm0/lstm_cell; scale 2^30 -> 2^29")


@pytest.mark.parametrize("big_replica", [0, 1])
def test_fit_under_mirrored_strategy_names_a_backward_overflow(
        mirrored_strategy, big_replica):
    """Inputs 100 times larger on one replica's half of the batch. tf_keras
    sums the replicas' gradients before they are checked (its
    `aggregate_gradients`), so both replicas see the Inf and the record
    names replica 0 and one other. Without XLA only: tf_keras'
    `jit_compile=True` fit does not run under a MirroredStrategy of two
    CPUs."""
    half = nf.BATCH // 2
    rows = slice(big_replica * half, (big_replica + 1) * half)
    x, y = nf.data(big_rows=rows, big=100.0)
    with mirrored_strategy.scope():
        model = nf.small_mlp(tf_keras)
        opt, monitor = _fit(model, x, y, 2.0**12, False)
    record = opt.last_skip
    assert (record.step, record.replica, record.replicas) == (0, 0, 2)
    assert (record.source, record.origin, record.source_kind, record.loss
            ) == ("l1", "backward", "Inf", "finite")
    assert monitor.lines[0].startswith(
        "step 0 skipped on replica 0 (and 1 other): Inf entered at l1 in "
        "the backward pass (the loss was finite); ")


@JIT
def test_the_deep_look_under_fit_names_the_cast_out_of_out_backward(
        jit_compile):
    opt, monitor = nf.fit(
        tf_keras, tf_lossscale.LossScaleMonitor,
        tf_lossscale.LossScaleOptimizer, nf.deep_mlp(tf_keras), *nf.data(),
        initial_scale=2.0**30, jit_compile=jit_compile, deep_look=True)
    assert len(monitor.lines) == 2, monitor.lines
    assert monitor.lines[1] == (
        "deep look at step 0: first NaN/Inf: Cast (float16) "
        "gradient_tape/net/out/Cast/Cast in the backward pass, layer out, "
        "fed by gradient_tape/net/out/MatMul/MatMul")
    assert (int(opt.skipped_steps), int(opt.iterations)) == (2, 2)


def _state(model, opt):
    """The model's variables, the Dropout's generator state, the
    optimizer's variables (slots, `iterations`), the scale, the count."""
    generator = model.get_layer("drop")._random_generator._generator
    return ([v.numpy() for v in model.variables]
            + [generator.state.numpy()],
            [v.numpy() for v in opt.variables()],
            float(opt.loss_scale), int(opt.iterations),
            int(opt.skipped_steps))


@JIT
def test_the_deep_look_under_fit_changes_nothing(jit_compile):
    """Two fits from the same seed, one with the deep look: NaN rows in
    batches 1 and 5 (two looks), a Dropout whose tf.random.Generator draws
    in every step; afterwards everything training carries is equal."""
    x, y = nf.data(nan_row=20, rows=4 * nf.BATCH)
    states, monitors = [], []
    for look in (True, False):
        tf_keras.utils.set_random_seed(0)
        model = nf.dropout_mlp(tf_keras, force_generator=True)
        opt = tf_lossscale.LossScaleOptimizer(
            tf_keras.optimizers.Adam(1e-2), initial_scale=2.0**10)
        model.compile(optimizer=opt, loss="mse", jit_compile=jit_compile)
        monitor = tf_lossscale.LossScaleMonitor(report=False,
                                                deep_look=look)
        model.fit(x, y, batch_size=nf.BATCH, epochs=2, shuffle=False,
                  verbose=0, callbacks=[monitor])
        states.append(_state(model, opt))
        monitors.append(monitor)
        assert "train_step" not in vars(model)
    looked, plain = states
    assert looked[2:] == plain[2:] == (2.0**8, 8, 2)
    assert len(looked[1]) > 2  # Adam's slots are there.
    for before, after in zip(looked[0] + looked[1], plain[0] + plain[1]):
        np.testing.assert_array_equal(before, after)
    deep = [line for line in monitors[0].lines
            if line.startswith("deep look")]
    print(deep)
    assert len(deep) == 2 and all(
        "in the forward pass" in line and "fed by the input batch" in line
        for line in deep), deep
