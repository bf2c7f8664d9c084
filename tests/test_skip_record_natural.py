"""The skip record on faults nothing planted (Keras 3; tf_keras:
`tf_keras_cases/cases_natural_faults.py`), with and without XLA.

Each names where the non-finite values entered (the layer nearest the
loss, in backpropagation order), the pass (the loss finite or not) and the
kind; the models are in `_natural_faults.py`.
"""

from __future__ import annotations

import re

import _natural_faults as nf
import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_lossscale
from tf_lossscale import backprop_order, deep_look

JIT = pytest.mark.parametrize("jit_compile", [False, True],
                              ids=["graph", "jit_compile"])


def _fit(model, x, y, scale, jit_compile, loss="mse"):
    return nf.fit(keras, tf_lossscale.LossScaleMonitor,
                  tf_lossscale.LossScaleOptimizer, model, x, y,
                  initial_scale=scale, jit_compile=jit_compile, loss=loss)


@JIT
def test_a_deep_mlp_at_a_huge_scale_names_l11_backward_inf(jit_compile):
    opt, monitor = _fit(nf.deep_mlp(keras), *nf.data(), 2.0**30,
                        jit_compile)
    record = opt.last_skip
    assert (nf.last_part(record.source), record.origin, record.source_kind,
            record.loss) == ("l11", "backward", "Inf", "finite")
    assert (record.count, record.total, record.order) == (24, 26, "backprop")
    assert nf.last_part(record.farthest) in ("l0/kernel", "kernel")
    assert record.farthest.endswith("l0/kernel")
    # Nearest the loss first: l11's two, then l10's.
    assert [n.rsplit("/", 2)[-2] for n in record.names] == [
        "l11", "l11", "l10", "l10", "l9", "l9", "l8", "l8"]
    assert monitor.lines[0] == (
        "step 0 skipped on replica 0: Inf entered at l11 in the backward "
        "pass (the loss was finite); 24 of 26 gradients non-finite, "
        "l11 .. l0; scale 2^30 -> 2^29")


@JIT
def test_a_residual_model_names_the_branch_layer_that_overflowed(
        jit_compile):
    opt, monitor = _fit(nf.residual(keras), *nf.data(), 2.0**10,
                        jit_compile)
    record = opt.last_skip
    # Branch a's layers only, never b1 or out; the trunk below the add may
    # follow. (TF 2.16's XLA keeps a2's kernel gradient finite and the
    # overflow enters at a1, through the x1000.)
    assert (nf.last_part(record.source) in ("a1", "a2"), record.origin,
            record.total) == (True, "backward", 10)
    assert not [n for n in record.names if n.startswith(("b1/", "out/"))]
    if jit_compile:
        # XLA's check tells no "NaN and Inf" from "NaN": a1's Inf - Inf
        # reads NaN there (TF 2.16).
        assert record.source_kind in ("Inf", "NaN")
        return
    assert record.source_kind == "Inf"
    assert (record.names, record.kinds) == (("a2/kernel",), ("Inf",))
    assert monitor.lines[0] == (
        "step 0 skipped on replica 0: Inf entered at a2 in the backward "
        "pass (the loss was finite); 1 of 10 gradients non-finite: "
        "a2/kernel; scale 2^10 -> 2^9")


@JIT
def test_attention_logits_overflowing_float16_name_the_forward_pass(
        jit_compile):
    x, y = nf.data()
    opt, monitor = _fit(nf.attention(keras), x.reshape(-1, 4, 2), y,
                        2.0**10, jit_compile)
    record = opt.last_skip
    assert (record.loss, record.origin, record.source_kind) == (
        "NaN", "forward", "NaN")
    assert (record.count, record.total, nf.last_part(record.source)) == (
        10, 10, "out")
    assert monitor.lines[0] == (
        "step 0 skipped on replica 0: the loss was NaN: the forward pass "
        "made it (an activation, the loss function or the input batch); "
        "10 of 10 gradients non-finite, out .. key; scale 2^10 -> 2^9")


@JIT
def test_a_log_of_zero_in_the_loss_names_the_forward_pass_and_inf(
        jit_compile):
    opt, monitor = _fit(nf.small_mlp(keras, zero_output=True), *nf.data(),
                        2.0**10, jit_compile, loss=nf.log_loss)
    record = opt.last_skip
    # Every step: the output stays 0 (a skipped step changes nothing).
    assert (record.loss, record.origin, record.first_step, record.streak
            ) == ("Inf", "forward", 0, 2)
    assert monitor.lines[0].startswith(
        "step 0 skipped on replica 0: the loss was Inf: the forward pass "
        "made it")


@JIT
def test_a_nan_in_the_input_batch_names_the_forward_pass(jit_compile):
    opt, monitor = _fit(nf.small_mlp(keras), *nf.data(nan_row=20),
                        2.0**10, jit_compile)
    record = opt.last_skip
    # Row 20 is in the second batch: step 1, and only it.
    assert (record.step, record.streak, record.loss, record.origin) == (
        1, 1, "NaN", "forward")
    assert (nf.last_part(record.source), record.source_kind) == ("out", "NaN")
    assert int(opt.skipped_steps) == 1
    assert monitor.lines[0].startswith(
        "step 1 skipped on replica 0: the loss was NaN: the forward pass "
        "made it (an activation, the loss function or the input batch); ")


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
    cast of l11's output gradient, backward) and, for the attention block,
    the logits' matmul (forward); no variable, slot or count moves."""
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
    assert str(found).startswith("first NaN/Inf: Cast (float16) gradient_tape/")
    assert (int(opt.iterations), float(opt.loss_scale),
            int(opt.skipped_steps)) == state == (1, 2.0**29, 1)
    for before, after in zip(weights, model.weights):
        np.testing.assert_array_equal(before, after.numpy())
    # At a scale that fits, nothing is non-finite.
    assert deep_look.first_nonfinite_op(
        loss_fn, model.trainable_variables, 1.0) is None

    attention = nf.attention(keras)
    found = deep_look.first_nonfinite_op(
        lambda: tf.reduce_mean(attention(tf.reshape(x, [-1, 4, 2])) - y),
        attention.trainable_variables, 2.0**10)
    assert (found.op_type, found.backward, found.dtype) == (
        "BatchMatMulV2", False, "float16")
    assert "attend" in found.op, found


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


@JIT
def test_a_conv_net_at_a_huge_scale_names_c3_backward(jit_compile):
    """The output gradient overflows float16 where it enters c3 (the conv
    layer nearest the loss). c3's own gradients hold NaN only (each filter
    gradient sums Inf x 0 and Inf - Inf terms), so that is the kind the
    record can see; the deep look names the Inf's op (below)."""
    x, y = nf.data()
    opt, monitor = _fit(nf.conv(keras), nf.images(x), y, 2.0**30,
                        jit_compile)
    record = opt.last_skip
    assert (record.source, record.origin, record.loss, record.source_kind
            ) == ("c3", "backward", "finite", "NaN")
    assert (record.count, record.total, record.order) == (8, 10, "backprop")
    assert [backprop_order.layer_of(n) for n in record.names] == [
        "c3", "c3", "c2", "c2", "c1", "c1", "c0", "c0"]
    assert monitor.lines[0] == (
        "step 0 skipped on replica 0: NaN entered at c3 in the backward "
        "pass (the loss was finite); 8 of 10 gradients non-finite, "
        "c3 .. c0; scale 2^30 -> 2^29")


@JIT
def test_an_lstm_at_a_huge_scale_names_lstm1_backward(jit_compile):
    x, y = nf.data()
    opt, monitor = _fit(nf.lstm(keras), nf.sequences(x), y, 2.0**30,
                        jit_compile)
    record = opt.last_skip
    assert (record.source, record.origin, record.loss, record.source_kind
            ) == ("lstm1/lstm_cell", "backward", "finite", "NaN")
    assert (record.count, record.total) == (6, 8)
    assert record.names == (
        "lstm1/lstm_cell/kernel", "lstm1/lstm_cell/recurrent_kernel",
        "lstm1/lstm_cell/bias", "lstm0/lstm_cell/kernel",
        "lstm0/lstm_cell/recurrent_kernel", "lstm0/lstm_cell/bias")
    assert monitor.lines[0] == (
        "step 0 skipped on replica 0: NaN entered at lstm1/lstm_cell in the "
        "backward pass (the loss was finite); 6 of 8 gradients non-finite, "
        "lstm1/lstm_cell .. lstm0/lstm_cell; scale 2^30 -> 2^29")


@pytest.mark.parametrize("big_replica, span", [
    (0, "2 of 6 gradients non-finite, l1 .. l0"),
    (1, "3 of 6 gradients non-finite, l1 .. l0")])
def test_fit_under_mirrored_strategy_names_the_replica_that_overflowed(
        mirrored_strategy, big_replica, span):
    """Inputs 100 times larger on one replica (fit gives each replica half
    of the batch of 16): its output gradient overflows float16 at 2^12
    where the other replica's does not. Without XLA only: Keras 3's
    `jit_compile=True` fit does not run under a MirroredStrategy of two
    CPUs (XLA reads every replica's variables from the first device)."""
    half = nf.BATCH // 2
    rows = slice(big_replica * half, (big_replica + 1) * half)
    x, y = nf.data(big_rows=rows, big=100.0)
    with mirrored_strategy.scope():
        model = nf.small_mlp(keras)
        opt, monitor = _fit(model, x, y, 2.0**12, False)
    record = opt.last_skip
    assert (record.step, record.replica, record.replicas) == (
        0, big_replica, 1)
    assert (record.source, record.origin, record.source_kind, record.loss
            ) == ("l1", "backward", "Inf", "finite")
    assert monitor.lines[0] == (
        f"step 0 skipped on replica {big_replica}: Inf entered at l1 in the "
        f"backward pass (the loss was finite); {span}; scale 2^12 -> 2^11")


def _deep_look_line(line):
    """A deep look line with Keras 3's unique name-scope suffixes
    (`net_3`, `Cast_1`) taken out."""
    return re.sub(r"_\d+(?=/)", "", line)


@JIT
def test_the_deep_look_under_fit_names_the_cast_into_l11_backward(
        jit_compile):
    opt, monitor = nf.fit(
        keras, tf_lossscale.LossScaleMonitor,
        tf_lossscale.LossScaleOptimizer, nf.deep_mlp(keras), *nf.data(),
        initial_scale=2.0**30, jit_compile=jit_compile, deep_look=True)
    assert len(monitor.lines) == 2, monitor.lines
    assert monitor.lines[0].startswith(
        "step 0 skipped on replica 0: Inf entered at l11 in the backward ")
    assert _deep_look_line(monitor.lines[1]) == (
        "deep look at step 0: first NaN/Inf: Cast (float16) "
        "gradient_tape/net/Cast/Cast in the backward pass, layer out, fed "
        "by gradient_tape/net/out/MatMul/MatMul")
    # Two steps, both skipped, one run: one deep look; fit's own train
    # step and train function are back.
    assert (int(opt.skipped_steps), int(opt.iterations)) == (2, 2)
    assert monitor._kept is None


@JIT
def test_the_deep_look_under_fit_names_the_conv_net_s_overflow(jit_compile):
    x, y = nf.data()
    opt, monitor = nf.fit(
        keras, tf_lossscale.LossScaleMonitor,
        tf_lossscale.LossScaleOptimizer, nf.conv(keras), nf.images(x), y,
        initial_scale=2.0**30, jit_compile=jit_compile, deep_look=True)
    assert _deep_look_line(monitor.lines[1]) == (
        "deep look at step 0: first NaN/Inf: Cast (float16) "
        "gradient_tape/net/Cast/Cast in the backward pass, layer out, fed "
        "by gradient_tape/net/out/MatMul/MatMul")


def _state(model, opt):
    """Everything training carries from step to step, as numpy: the
    model's variables (the Dropout's seed generator's state among them),
    the optimizer's (slots, `iterations`, the scale, the counts)."""
    return ([v.numpy() for v in model.variables],
            [v.numpy() for v in opt.variables],
            float(opt.loss_scale), int(opt.iterations),
            int(opt.skipped_steps))


@JIT
def test_the_deep_look_under_fit_changes_nothing(jit_compile):
    """Two runs of fit from the same seed, one with the deep look: a NaN
    row in batches 1 and 5 (two runs of one skipped step, two looks), a
    Dropout drawing in every step; afterwards every variable, slot, the
    scale, `iterations` and the seed generator's state are equal."""
    x, y = nf.data(nan_row=20, rows=4 * nf.BATCH)
    states, monitors, models = [], [], []
    for look in (True, False):
        keras.utils.set_random_seed(0)
        model = nf.dropout_mlp(keras)
        opt = tf_lossscale.LossScaleOptimizer(
            keras.optimizers.Adam(1e-2), initial_scale=2.0**10)
        model.compile(optimizer=opt, loss="mse", jit_compile=jit_compile)
        monitor = tf_lossscale.LossScaleMonitor(report=False,
                                                deep_look=look)
        model.fit(x, y, batch_size=nf.BATCH, epochs=2, shuffle=False,
                  verbose=0, callbacks=[monitor])
        states.append(_state(model, opt))
        monitors.append(monitor)
        models.append(model)
    looked, plain = states
    assert looked[2:] == plain[2:] == (2.0**8, 8, 2)
    seed = [m.get_layer("drop").seed_generator.state.numpy()
            for m in models]
    np.testing.assert_array_equal(seed[0], seed[1])
    assert int(seed[0][0]) != 3 or int(seed[0][1]) != 0  # It drew.
    for before, after in zip(looked[0] + looked[1], plain[0] + plain[1]):
        np.testing.assert_array_equal(before, after)
    deep = [line for line in monitors[0].lines
            if line.startswith("deep look")]
    assert [_deep_look_line(line) for line in deep] == [
        f"deep look at step {step}: first NaN/Inf: Cast (float16) net/Cast "
        "in the forward pass, fed by the input batch" for step in (1, 5)]
    assert not [line for line in monitors[1].lines
                if line.startswith("deep look")]
    assert "train_step" not in vars(models[0])


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
