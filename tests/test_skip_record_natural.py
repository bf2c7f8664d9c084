"""The skip record on faults nothing planted, Keras 3 only, with and without
XLA.

The tests that hold on both Kerases (a deep MLP, a residual model, attention
logits, the log of zero, a NaN in the input batch, a conv net, an LSTM,
MirroredStrategy, the deep look under `fit`) are written once, in
`_both_natural_faults.py`, and run here on Keras 3 (imported below; the
`flavour` fixture is Keras 3's in this process) and in
`tf_keras_cases/cases_natural_faults.py` on tf_keras. Those below use what
Keras 3 alone has (`apply`, its eager loop, its per-replica check). The
models are in `_natural_faults.py`.
"""

from __future__ import annotations

import _natural_faults as nf
import keras
import numpy as np
import pytest
import tensorflow as tf
from _both_natural_faults import *  # noqa: F403 (the tests on both Kerases)
from _both_natural_faults import JIT

import tf_lossscale
from tf_lossscale import deep_look


def test_an_eager_loop_says_its_list_is_in_variable_order():
    model = nf.small_mlp(keras)
    opt = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(1e-3))
    x, y = nf.data(nan_row=0)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(x[:nf.BATCH]) - y[:nf.BATCH]) ** 2)
        scaled = opt.scale_loss(loss)
    grads = tape.gradient(scaled, model.trainable_variables)
    opt.apply(grads, model.trainable_variables)
    record = opt.last_skip
    assert (record.order, record.source, record.loss, record.origin) == (
        "variable", None, "NaN", "forward")
    assert str(record) == (
        "step 0 skipped on replica 0: 6 of 6 gradients non-finite (NaN), in "
        "variable order: l0/kernel, l0/bias, l1/kernel, l1/bias, out/kernel,"
        " out/bias; the loss was NaN: the forward pass made it (an "
        "activation, the loss function or the input batch); scale 2^15")


@pytest.mark.parametrize("nan_replica", [0, 1])
def test_a_nan_batch_on_one_replica_names_it_and_the_forward_pass(
        mirrored_strategy, nan_replica):
    """Each replica's loss is its own: the record says the NaN replica's
    loss was NaN (the other's was finite)."""
    with mirrored_strategy.scope():
        model = nf.small_mlp(keras)
        opt = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(1e-3))
        opt.build(model.trainable_variables)
    x, y = nf.data()

    def replica_step(x, y):
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        x = tf.where(tf.equal(replica, nan_replica),
                     x * float("nan"), x)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
            scaled = opt.scale_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        opt.apply(grads, model.trainable_variables)

    tf.function(lambda x, y: mirrored_strategy.run(replica_step, (x, y)))(
        tf.constant(x[:nf.BATCH]), tf.constant(y[:nf.BATCH]))
    record = opt.last_skip
    assert (record.replica, record.replicas, record.loss, record.origin) == (
        nan_replica, 1, "NaN", "forward")
    assert (nf.last_part(record.source), record.count) == ("out", 6)


@JIT
def test_the_documented_flow_in_a_tf_function_names_l11(jit_compile):
    """get_scaled_loss / get_unscaled_gradients / apply_gradients: the
    order is read through the unscaling division."""
    model = nf.deep_mlp(keras)
    opt = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(1e-3),
                                          initial_scale=2.0**30)
    x, y = nf.data()

    @tf.function(jit_compile=jit_compile)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
            scaled = opt.get_scaled_loss(loss)
        grads = opt.get_unscaled_gradients(
            tape.gradient(scaled, model.trainable_variables))
        opt.apply_gradients(zip(grads, model.trainable_variables))

    step(tf.constant(x[:nf.BATCH]), tf.constant(y[:nf.BATCH]))
    record = opt.last_skip
    assert (nf.last_part(record.source), record.source_kind, record.origin,
            record.count, record.total) == ("l11", "Inf", "backward", 24, 26)


def test_the_deep_look_names_the_op_and_pass_and_changes_nothing():
    """After a skipped step: the first op that made an Inf (the float16
    cast of l11's output gradient, backward); no variable, slot or count
    moves. (The attention block's forward overflow, on both Kerases:
    `test_the_deep_look_names_the_attention_logits_forward`.)"""
    model = nf.deep_mlp(keras)
    opt = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(1e-3),
                                          initial_scale=2.0**30)
    x, y = nf.data()
    x, y = tf.constant(x[:nf.BATCH]), tf.constant(y[:nf.BATCH])

    def loss_fn():
        return tf.reduce_mean((model(x) - y) ** 2)

    with tf.GradientTape() as tape:
        scaled = opt.scale_loss(loss_fn())
    opt.apply(tape.gradient(scaled, model.trainable_variables),
              model.trainable_variables)
    weights = [w.numpy() for w in model.weights]
    state = (int(opt.iterations), float(opt.loss_scale),
             int(opt.skipped_steps))
    found = deep_look.first_nonfinite_op(
        loss_fn, model.trainable_variables, opt.last_skip.scale)
    assert (found.op_type, found.dtype, found.backward) == (
        "Cast", "float16", True)
    assert found.input.endswith("out/MatMul/MatMul") or (
        "/out" in found.input), found
    assert str(found).startswith("first Inf: Cast (float16) gradient_tape/")
    # Replayed at scale 1 too, where it was finite: the scale made it.
    assert (found.kind, found.overflow) == ("Inf", True)
    assert (int(opt.iterations), float(opt.loss_scale),
            int(opt.skipped_steps)) == state == (1, 2.0**29, 1)
    for before, after in zip(weights, model.weights):
        np.testing.assert_array_equal(before, after.numpy())
    # At a scale that fits, nothing is non-finite.
    assert deep_look.first_nonfinite_op(
        loss_fn, model.trainable_variables, 1.0) is None


def test_a_nan_batch_that_persists_to_min_scale_stops_naming_the_forward_pass():
    model = nf.small_mlp(keras)
    opt = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(1e-3), initial_scale=4.0, min_scale=1.0,
        max_consecutive_skips=3)
    x, y = nf.data(nan_row=0)
    x, y = tf.constant(x[:nf.BATCH]), tf.constant(y[:nf.BATCH])

    def step():
        with tf.GradientTape() as tape:
            scaled = opt.scale_loss(tf.reduce_mean((model(x) - y) ** 2))
        opt.apply(tape.gradient(scaled, model.trainable_variables),
                  model.trainable_variables)

    step()
    step()
    with pytest.raises(tf_lossscale.SkipStreakError) as caught:
        step()
    message = str(caught.value)
    assert "steps 0 to 2" in message and "the scale is now 2^0" in message
    assert message.endswith(
        "It is at min_scale: the loss itself was NaN: a fault of the forward "
        "pass (the input batch, an activation or the loss function), which "
        "no loss scale fixes."), message


def test_a_fit_that_fails_with_the_deep_look_on_leaves_the_model_as_it_was():
    """`max_consecutive_skips=1` fails `fit` in its first skipped step
    (no `on_train_end`): the kept batch's wrapper is gone all the same,
    and the next `fit` trains through the model's own train step."""
    x, y = nf.data(nan_row=20, rows=4 * nf.BATCH)
    model = nf.dropout_mlp(keras)
    opt = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(1e-3), initial_scale=2.0**10,
        max_consecutive_skips=1)
    model.compile(optimizer=opt, loss="mse")
    model.make_train_function()
    own_function = model.train_function
    monitor = tf_lossscale.LossScaleMonitor(report=False, deep_look=True)
    # Inside fit's graph the stop surfaces as SkipStreakError's base class.
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="SkipStreakError: 1 steps in a row"):
        model.fit(x, y, batch_size=nf.BATCH, epochs=1, shuffle=False,
                  verbose=0, callbacks=[monitor])
    assert "train_step" not in vars(model)
    assert model.train_function is own_function
    clean_x, clean_y = nf.data(rows=2 * nf.BATCH)
    history = model.fit(clean_x, clean_y, batch_size=nf.BATCH, verbose=0)
    assert set(history.history) == {"loss"}
    assert int(opt.iterations) == 4


@pytest.mark.parametrize("mode", ["eager", "graph", "jit_compile"])
def test_a_conv_net_in_a_custom_loop_names_c3_or_says_variable_order(mode):
    """The conv net's overflow in a custom loop (`scale_loss` and
    `apply`): traced, the record names c3 in the backward pass; eagerly
    no order is known and the record says its list is in variable order
    (the loss still tells the pass)."""
    model = nf.conv(keras)
    opt = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(1e-3),
                                          initial_scale=2.0**30)
    x, y = nf.data()
    x, y = tf.constant(nf.images(x)[:nf.BATCH]), tf.constant(y[:nf.BATCH])

    def step(x, y):
        with tf.GradientTape() as tape:
            scaled = opt.scale_loss(tf.reduce_mean((model(x) - y) ** 2))
        opt.apply(tape.gradient(scaled, model.trainable_variables),
                  model.trainable_variables)

    if mode != "eager":
        step = tf.function(step, jit_compile=mode == "jit_compile")
    step(x, y)
    record = opt.last_skip
    assert (record.origin, record.count, record.total) == ("backward", 8, 10)
    if mode == "eager":
        assert (record.order, record.source) == ("variable", None)
        assert record.names[0] == "c0/kernel"
    else:
        assert (record.order, record.source, record.source_kind) == (
            "backprop", "c3", "NaN")
