"""The skip record on natural faults in real `fit` runs, on both Kerases.

Written once and run on each flavour (`tests/_flavours.py`):
`tests/test_skip_record_natural.py` runs these tests on Keras 3,
`tf_keras_cases/cases_natural_faults.py` on tf_keras, each in its own
process, with and without XLA. Each names where the non-finite values
entered (the layer nearest the loss, in backpropagation order), the pass
(the loss finite or not) and the kind; the models are in
`_natural_faults.py`. Where the flavours differ in a fact (how many
replicas see an overflow, the name of an op the deep look finds, where the
Dropout keeps its seed), the fact is in a table keyed by `flavour.name`.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Dict, List, Tuple

import _natural_faults as nf
import numpy as np
import pytest
import tensorflow as tf
from _flavours import Flavour, replica_values

import tf_lossscale
from tf_lossscale import backprop_order, deep_look

JIT = pytest.mark.parametrize("jit_compile", [False, True],
                              ids=["graph", "jit_compile"])


def fit_with_monitor(flavour: Flavour, model: Any, x: np.ndarray,
                     y: np.ndarray, scale: float, jit_compile: bool,
                     loss: Any = "mse", deep_look: bool = False
                     ) -> Tuple[Any, Any]:
    """`nf.fit` on the flavour's Keras: (optimizer, monitor)."""
    return nf.fit(flavour.keras, tf_lossscale.LossScaleMonitor,
                  tf_lossscale.LossScaleOptimizer, model, x, y,
                  initial_scale=scale, jit_compile=jit_compile, loss=loss,
                  deep_look=deep_look)


# Keras 3 makes name scopes unique with suffixes (`net_3`, `Cast_1`) that
# depend on what the process built before; tf_keras' names here have none.
UNIQUE_SUFFIXES = {"keras3": True, "tf_keras": False}


def deep_look_line(flavour: Flavour, line: str) -> str:
    """A deep look line with Keras 3's unique name-scope suffixes taken
    out (tf_keras': as it is)."""
    if UNIQUE_SUFFIXES[flavour.name]:
        return re.sub(r"_\d+(?=/)", "", line)
    return line


# --- The tests, on the flavour of the process (the `flavour` fixture) -------


@JIT
def test_a_deep_mlp_at_a_huge_scale_names_l11_backward_inf(flavour,
                                                            jit_compile):
    opt, monitor = fit_with_monitor(flavour, nf.deep_mlp(flavour.keras),
                                    *nf.data(), 2.0**30, jit_compile)
    record = opt.last_skip
    assert (nf.last_part(record.source), record.origin, record.source_kind,
            record.loss) == ("l11", "backward", "Inf", "finite")
    assert (record.count, record.total, record.order) == (24, 26, "backprop")
    assert nf.last_part(record.farthest) in ("l0/kernel", "kernel")
    assert record.farthest.endswith("l0/kernel")
    # Nearest the loss first: l11's two, then l10's.
    assert [n.rsplit("/", 2)[-2] for n in record.names] == [
        "l11", "l11", "l10", "l10", "l9", "l9", "l8", "l8"]
    assert monitor.lines[0].startswith(
        "step 0 skipped on replica 0: Inf entered at ")
    assert monitor.lines[0] == (
        "step 0 skipped on replica 0: Inf entered at l11 in the backward "
        "pass (the loss was finite); 24 of 26 gradients non-finite, "
        "l11 .. l0; scale 2^30 -> 2^29")


@JIT
def test_a_residual_model_names_the_branch_layer_that_overflowed(
        flavour, jit_compile):
    opt, monitor = fit_with_monitor(flavour, nf.residual(flavour.keras),
                                    *nf.data(), 2.0**10, jit_compile)
    record = opt.last_skip
    # Branch a's layers only, never b1 or out; the trunk below the add may
    # follow. (TF 2.16's XLA keeps a2's kernel gradient finite and the
    # overflow enters at a1, through the x1000.)
    assert (nf.last_part(record.source) in ("a1", "a2"), record.origin,
            record.total) == (True, "backward", 10)
    assert not [n for n in record.names if "b1/" in n or "out/" in n]
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
        flavour, jit_compile):
    x, y = nf.data()
    opt, monitor = fit_with_monitor(flavour, nf.attention(flavour.keras),
                                    x.reshape(-1, 4, 2), y, 2.0**10,
                                    jit_compile)
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
        flavour, jit_compile):
    opt, monitor = fit_with_monitor(
        flavour, nf.small_mlp(flavour.keras, zero_output=True), *nf.data(),
        2.0**10, jit_compile, loss=nf.log_loss)
    record = opt.last_skip
    # Every step: the output stays 0 (a skipped step changes nothing).
    assert (record.loss, record.origin, record.first_step, record.streak
            ) == ("Inf", "forward", 0, 2)
    assert monitor.lines[0].startswith(
        "step 0 skipped on replica 0: the loss was Inf: the forward pass "
        "made it")


@JIT
def test_a_nan_in_the_input_batch_names_the_forward_pass(flavour,
                                                         jit_compile):
    opt, monitor = fit_with_monitor(flavour, nf.small_mlp(flavour.keras),
                                    *nf.data(nan_row=20), 2.0**10,
                                    jit_compile)
    record = opt.last_skip
    # Row 20 is in the second batch: step 1, and only it.
    assert (record.step, record.streak, record.loss, record.origin) == (
        1, 1, "NaN", "forward")
    assert (nf.last_part(record.source), record.source_kind) == ("out", "NaN")
    assert int(opt.skipped_steps) == 1
    assert monitor.lines[0].startswith(
        "step 1 skipped on replica 0: the loss was NaN: the forward pass "
        "made it (an activation, the loss function or the input batch); ")


def test_the_deep_look_names_the_attention_logits_forward(flavour):
    """The first op that made a non-finite value in the attention block is
    the logits' matmul, in the forward pass."""
    x, y = nf.data()
    model = nf.attention(flavour.keras)
    inputs = tf.constant(x[:nf.BATCH].reshape(-1, 4, 2))
    found = deep_look.first_nonfinite_op(
        lambda: tf.reduce_mean(model(inputs) - y[:nf.BATCH]),
        model.trainable_variables, 2.0**10)
    assert (found.op_type, found.backward, found.dtype) == (
        "BatchMatMulV2", False, "float16")
    assert "attend" in found.op, found


@JIT
def test_a_conv_net_at_a_huge_scale_names_c3_backward(flavour, jit_compile):
    """The output gradient overflows float16 where it enters c3 (the conv
    layer nearest the loss). c3's own gradients hold NaN only (each filter
    gradient sums Inf x 0 and Inf - Inf terms), so that is the kind the
    record can see; the deep look names the Inf's op."""
    x, y = nf.data()
    opt, monitor = fit_with_monitor(flavour, nf.conv(flavour.keras),
                                    nf.images(x), y, 2.0**30, jit_compile)
    record = opt.last_skip
    assert (record.source, record.origin, record.loss, record.source_kind
            ) == ("c3", "backward", "finite", "NaN")
    assert (record.count, record.total, record.order) == (8, 10, "backprop")
    assert [backprop_order.layer_of(n) for n in record.names] == [
        "c3", "c3", "c2", "c2", "c1", "c1", "c0", "c0"]
    assert monitor.lines[0] == (
        "step 0 skipped on replica 0: NaN entered at c3 in the backward "
        "pass (the loss was finite; float16 overflow can leave NaN here); "
        "8 of 10 gradients non-finite, "
        "c3 .. c0; scale 2^30 -> 2^29")


@JIT
def test_an_lstm_at_a_huge_scale_names_lstm1_backward(flavour, jit_compile):
    x, y = nf.data()
    opt, monitor = fit_with_monitor(flavour, nf.lstm(flavour.keras),
                                    nf.sequences(x), y, 2.0**30, jit_compile)
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
        "backward pass (the loss was finite; float16 overflow can leave NaN "
        "here); 6 of 8 gradients non-finite, "
        "lstm1/lstm_cell .. lstm0/lstm_cell; scale 2^30 -> 2^29")


@JIT
def test_a_conv_overflow_the_back_off_cures_is_called_overflow(
        flavour, jit_compile):
    """The conv net's first line cannot tell overflow from a real NaN (its
    source's gradients hold NaN only); once the back-off lets a step
    through, the monitor says it was overflow, once, with the run's steps
    and the scale that cured it."""
    x, y = nf.data()
    opt, monitor = nf.fit(flavour.keras, tf_lossscale.LossScaleMonitor,
                          tf_lossscale.LossScaleOptimizer,
                          nf.conv(flavour.keras), nf.images(x), y,
                          initial_scale=2.0**30, jit_compile=jit_compile,
                          epochs=12)
    skipped, scale = int(opt.skipped_steps), float(opt.loss_scale)
    # Every skip was in the first run; the scale fell once per skip.
    assert 2 < skipped < int(opt.iterations)
    assert scale == 2.0**(30 - skipped)
    last = opt.last_skip
    assert (last.first_step, last.step, last.streak) == (0, skipped - 1,
                                                         skipped)
    assert monitor.lines == [
        "step 0 skipped on replica 0: NaN entered at c3 in the backward "
        "pass (the loss was finite; float16 overflow can leave NaN here); "
        "8 of 10 gradients non-finite, c3 .. c0; scale 2^30 -> 2^29",
        f"steps 0-{skipped - 1} skipped, and the next applied at "
        f"2^{30 - skipped}: the NaN at c3 was float16 overflow, which the "
        "back-off cured"]


# Per flavour and replica with the big inputs: the record's replica and
# count of other replicas, and the monitor's line. Keras 3 checks each
# replica's gradients before they are summed: the record names the big
# replica alone. tf_keras sums the replicas' gradients before they are
# checked (its `aggregate_gradients`), so both replicas see the Inf and the
# record names replica 0 and one other.
MIRRORED: Dict[Tuple[str, int], Tuple[int, int, str]] = {
    ("keras3", 0): (0, 1, (
        "step 0 skipped on replica 0: Inf entered at l1 in the backward "
        "pass (the loss was finite); 2 of 6 gradients non-finite, l1 .. l0; "
        "scale 2^12 -> 2^11")),
    ("keras3", 1): (1, 1, (
        "step 0 skipped on replica 1: Inf entered at l1 in the backward "
        "pass (the loss was finite); 3 of 6 gradients non-finite, l1 .. l0; "
        "scale 2^12 -> 2^11")),
    ("tf_keras", 0): (0, 2, (
        "step 0 skipped on replica 0 (and 1 other): Inf entered at l1 in "
        "the backward pass (the loss was finite); 2 of 6 gradients "
        "non-finite, l1 .. l0; scale 2^12 -> 2^11")),
    ("tf_keras", 1): (0, 2, (
        "step 0 skipped on replica 0 (and 1 other): Inf entered at l1 in "
        "the backward pass (the loss was finite); 3 of 6 gradients "
        "non-finite, l1 .. l0; scale 2^12 -> 2^11")),
}


@pytest.mark.parametrize("big_replica", [0, 1])
def test_fit_under_mirrored_strategy_names_a_backward_overflow(
        flavour, mirrored_strategy, big_replica):
    """Inputs 100 times larger on one replica (fit gives each replica half
    of the batch of 16): its output gradient overflows float16 at 2^12
    where the other replica's does not; which replicas the record names is
    the flavour's (`MIRRORED`). Without XLA only: neither Keras'
    `jit_compile=True` fit runs under a MirroredStrategy of two CPUs (XLA
    reads every replica's variables from the first device)."""
    half = nf.BATCH // 2
    rows = slice(big_replica * half, (big_replica + 1) * half)
    x, y = nf.data(big_rows=rows, big=100.0)
    with mirrored_strategy.scope():
        model = nf.small_mlp(flavour.keras)
        opt, monitor = fit_with_monitor(flavour, model, x, y, 2.0**12,
                                        False)
    replica, replicas, line = MIRRORED[flavour.name, big_replica]
    record = opt.last_skip
    assert (record.step, record.replica, record.replicas) == (
        0, replica, replicas)
    assert (record.source, record.origin, record.source_kind, record.loss
            ) == ("l1", "backward", "Inf", "finite")
    assert monitor.lines[0] == line


# The op the deep look finds first at deep_mlp's overflow under fit: the
# cast of `out`'s float32 input gradient to float16 on its way into l11
# (Keras 3 makes it in the model's name scope, tf_keras in `out`'s).
CAST_INTO_L11 = {"keras3": "gradient_tape/net/Cast/Cast",
                 "tf_keras": "gradient_tape/net/out/Cast/Cast"}


@JIT
def test_the_deep_look_under_fit_names_the_cast_into_l11_backward(
        flavour, jit_compile):
    opt, monitor = fit_with_monitor(flavour, nf.deep_mlp(flavour.keras),
                                    *nf.data(), 2.0**30, jit_compile,
                                    deep_look=True)
    assert len(monitor.lines) == 2, monitor.lines
    assert monitor.lines[0].startswith(
        "step 0 skipped on replica 0: Inf entered at l11 in the backward ")
    assert deep_look_line(flavour, monitor.lines[1]) == (
        "deep look at step 0: first Inf: Cast (float16) "
        f"{CAST_INTO_L11[flavour.name]} in the backward pass, layer out, "
        "fed by gradient_tape/net/out/MatMul/MatMul; finite at scale 1: "
        "float16 overflow")
    # Two steps, both skipped, one run: one deep look; fit's own train
    # step and train function are back.
    assert (int(opt.skipped_steps), int(opt.iterations)) == (2, 2)
    assert monitor._kept is None


@JIT
@pytest.mark.parametrize("net", ["conv", "lstm"])
def test_the_deep_look_says_inf_entered_where_the_gradients_hold_nan(
        flavour, jit_compile, net):
    """At the conv net's and the LSTM's overflow the source layer's own
    gradients hold NaN only (c3's filter gradients, lstm1's kernels sum
    Inf x 0 and Inf - Inf): the optimizer's record says NaN entered there
    (above), having nothing else to go by. With the deep look, whose first
    non-finite op (the cast of `out`'s input gradient to float16) held an
    Inf and whose replay at scale 1 was finite, the monitor's line says
    Inf: float16 overflow."""
    build, inputs, source = {
        "conv": (nf.conv, nf.images, "c3"),
        "lstm": (nf.lstm, nf.sequences, "lstm1/lstm_cell")}[net]
    x, y = nf.data()
    opt, monitor = fit_with_monitor(flavour, build(flavour.keras), inputs(x),
                                    y, 2.0**30, jit_compile, deep_look=True)
    assert (opt.last_skip.source, opt.last_skip.source_kind) == (source,
                                                                 "NaN")
    assert len(monitor.lines) == 2, monitor.lines
    assert monitor.lines[0].startswith(
        f"step 0 skipped on replica 0: Inf entered at {source} in the "
        "backward pass (the loss was finite); "), monitor.lines
    assert deep_look_line(flavour, monitor.lines[1]) == (
        "deep look at step 0: first Inf: Cast (float16) "
        f"{CAST_INTO_L11[flavour.name]} in the backward pass, layer out, "
        f"fed by gradient_tape/net/out/MatMul/MatMul{SCALE_ONE_FINITE}")


# Where the norm's gradient is: Keras 3 computes a compiled loss in a
# `compile_loss` name scope.
NORM_GRADIENT = {"keras3": "gradient_tape/compile_loss/norm_loss/norm",
                 "tf_keras": "gradient_tape/norm_loss/norm"}


@JIT
def test_a_real_backward_nan_stays_nan_with_the_deep_look(flavour,
                                                          jit_compile):
    """The norm of a zero output: a finite loss whose gradient is a real
    NaN at any scale (the sqrt's gradient at 0 is +Inf, times 0). Its first
    op held an Inf too, but the replay at scale 1 is not finite either, so
    the line keeps NaN and the look says it is not overflow."""
    opt, monitor = fit_with_monitor(
        flavour, nf.small_mlp(flavour.keras, zero_output=True), *nf.data(),
        2.0**10, jit_compile, loss=nf.norm_loss, deep_look=True)
    assert (opt.last_skip.origin, opt.last_skip.source_kind) == (
        "backward", "NaN")
    assert monitor.lines == [
        "step 0 skipped on replica 0: NaN entered at out in the backward "
        "pass (the loss was finite); 6 of 6 gradients non-finite, out .. l0;"
        " scale 2^10 -> 2^9",
        "deep look at step 0: first Inf: SqrtGrad (float32) "
        f"{NORM_GRADIENT[flavour.name]}/SqrtGrad in the backward pass; "
        "non-finite at scale 1 too: not overflow"]


# Per flavour: the Dropout's arguments that give it a seed state variable
# (tf_keras: a `tf.random.Generator`'s, only when forced), how that state
# is read, and its value when the model is built (before any draw); what
# the optimizer's variables are (tf_keras: a method); and the op the deep
# look finds first at a NaN in the input batch (the float16 cast of the
# input, and the layer tf_keras names with it).
DROPOUT_ARGUMENTS: Dict[str, Dict[str, Any]] = {
    "keras3": {}, "tf_keras": {"force_generator": True}}
SEED_STATE: Dict[str, Callable[[Any], Any]] = {
    "keras3": lambda layer: layer.seed_generator.state,
    "tf_keras": lambda layer: layer._random_generator._generator.state}
SEED_AT_START = {"keras3": [3, 0], "tf_keras": [3, 0, 0]}
OPTIMIZER_VARIABLES: Dict[str, Callable[[Any], Any]] = {
    "keras3": lambda opt: opt.variables,
    "tf_keras": lambda opt: opt.variables()}
CAST_OF_THE_INPUT = {"keras3": "net/Cast in the forward pass",
                     "tf_keras": "net/l0/Cast in the forward pass, layer l0"}


def _state(flavour: Flavour, model: Any, opt: Any) -> Tuple[Any, ...]:
    """Everything training carries from step to step, as numpy: the
    model's variables and the Dropout's seed state, the optimizer's
    (slots, `iterations`), the scale, `iterations`, the count."""
    seed = SEED_STATE[flavour.name](model.get_layer("drop"))
    return ([v.numpy() for v in model.variables] + [seed.numpy()],
            [v.numpy() for v in OPTIMIZER_VARIABLES[flavour.name](opt)],
            float(opt.loss_scale), int(opt.iterations),
            int(opt.skipped_steps))


@JIT
def test_the_deep_look_under_fit_changes_nothing(flavour, jit_compile):
    """Two runs of fit from the same seed, one with the deep look: a NaN
    row in batches 1 and 5 (two runs of one skipped step, two looks), a
    Dropout drawing in every step; afterwards every variable, slot, the
    scale, `iterations` and the seed state are equal."""
    k = flavour.keras
    x, y = nf.data(nan_row=20, rows=4 * nf.BATCH)
    states, monitors, models, starts = [], [], [], []
    for look in (True, False):
        k.utils.set_random_seed(0)
        model = nf.dropout_mlp(k, **DROPOUT_ARGUMENTS[flavour.name])
        starts.append(SEED_STATE[flavour.name](
            model.get_layer("drop")).numpy().tolist())
        opt = tf_lossscale.LossScaleOptimizer(
            k.optimizers.Adam(1e-2), initial_scale=2.0**10)
        model.compile(optimizer=opt, loss="mse", jit_compile=jit_compile)
        monitor = tf_lossscale.LossScaleMonitor(report=False,
                                                deep_look=look)
        model.fit(x, y, batch_size=nf.BATCH, epochs=2, shuffle=False,
                  verbose=0, callbacks=[monitor])
        states.append(_state(flavour, model, opt))
        monitors.append(monitor)
        models.append(model)
        assert "train_step" not in vars(model)
    looked, plain = states
    assert looked[2:] == plain[2:] == (2.0**8, 8, 2)
    assert len(looked[1]) > 2  # Adam's slots are there.
    seed = [SEED_STATE[flavour.name](m.get_layer("drop")).numpy()
            for m in models]
    np.testing.assert_array_equal(seed[0], seed[1])
    assert starts == [SEED_AT_START[flavour.name]] * 2
    assert seed[0].tolist() != starts[0]  # It drew.
    for before, after in zip(looked[0] + looked[1], plain[0] + plain[1]):
        np.testing.assert_array_equal(before, after)
    deep = [line for line in monitors[0].lines
            if line.startswith("deep look")]
    assert [deep_look_line(flavour, line) for line in deep] == [
        f"deep look at step {step}: first NaN: Cast (float16) "
        f"{CAST_OF_THE_INPUT[flavour.name]}, fed by the "
        "input batch" for step in (1, 5)], deep
    assert not [line for line in monitors[1].lines
                if line.startswith("deep look")]


# --- The deep look under MirroredStrategy (two replicas) ---------------------

# The deep look's lines (Keras 3's name-scope suffixes taken out) under a
# two-replica MirroredStrategy. Keras 3's record names the replica whose
# gradients were non-finite, whose batch is replayed and makes the fault.
# tf_keras sums the replicas' gradients before its check, so both see the
# fault: its record names the replica whose own loss was not finite (the
# NaN batch's), else replica 0, so on replica 1's overflow the look replays
# replica 0's batch, finds it finite, and goes on to replica 1's.
STAYED_FINITE = {"keras3": "", "tf_keras": " (replica 0's stayed finite)"}
# How many other replicas saw the non-finite gradients.
OTHERS = {"keras3": "", "tf_keras": " (and 1 other)"}
# The ops where replica 0's and replica 1's big inputs overflow in `l1`'s
# backward pass: its kernel's gradient (a matmul summing over the rows),
# and on replica 1 its bias's too (the sum over the rows), which run side
# by side, so either check may fail first.
L1_OVERFLOW = {
    0: ["MatMul (float16) gradient_tape/net/l1/MatMul/MatMul_1 in the "
        "backward pass, layer l1"],
    1: ["MatMul (float16) gradient_tape/net/l1/MatMul/MatMul_1 in the "
        "backward pass, layer l1",
        "BiasAddGrad (float16) gradient_tape/net/l1/BiasAdd/BiasAddGrad in "
        "the backward pass, layer l1, fed by gradient_tape/net/l1/ReluGrad"]}
# What the look adds after a backward op: the replay at scale 1 was finite.
SCALE_ONE_FINITE = "; finite at scale 1: float16 overflow"


def mirrored_look(flavour: Flavour, fault: str, replica: int,
                  step: int = 0) -> List[str]:
    """The lines the deep look may print at a fault on `replica`."""
    before = (STAYED_FINITE[flavour.name] if replica and fault != "nan"
              else "")
    head = f"deep look at step {step}, replica {replica}'s batch{before}: "
    if fault == "nan":
        return [f"{head}first NaN: Cast (float16) "
                f"{CAST_OF_THE_INPUT[flavour.name]}, fed by the input batch"]
    return [f"{head}first Inf: {op}{SCALE_ONE_FINITE}"
            for op in L1_OVERFLOW[replica]]


def _mirrored_fault(fault: str, replica: int) -> Tuple[np.ndarray,
                                                       np.ndarray, float]:
    """Two batches of 16 whose first has a fault only on `replica`'s half
    (fit gives each replica 8 rows): an input row with a NaN, or inputs 100
    times larger, whose output gradient overflows float16 at 2^12 where
    the other half's does not; and the initial scale."""
    half = nf.BATCH // 2
    if fault == "nan":
        return (*nf.data(nan_row=replica * half + 2), 2.0**10)
    rows = slice(replica * half, (replica + 1) * half)
    return (*nf.data(big_rows=rows, big=100.0), 2.0**12)


@pytest.mark.parametrize("fault,replica", [("overflow", 0), ("overflow", 1),
                                           ("nan", 1)])
def test_the_deep_look_under_mirrored_strategy_replays_the_faulty_replica(
        flavour, mirrored_strategy, fault, replica):
    """`fit` under a two-replica MirroredStrategy: the deep look replays
    the batch of the replica the fault was on and names the op, its
    layer and its pass, as on one replica. (Without XLA: neither Keras'
    `jit_compile=True` fit runs under a MirroredStrategy of two CPUs.)"""
    x, y, scale = _mirrored_fault(fault, replica)
    with mirrored_strategy.scope():
        model = nf.small_mlp(flavour.keras)
        opt, monitor = fit_with_monitor(flavour, model, x, y, scale, False,
                                        deep_look=True)
    assert (opt.last_skip.step, int(opt.skipped_steps)) == (0, 1)
    assert len(monitor.lines) == 2, monitor.lines
    if fault == "nan":
        assert monitor.lines[0].startswith(
            f"step 0 skipped on replica 1{OTHERS[flavour.name]}: the loss "
            "was NaN: the forward pass made it"), monitor.lines
    assert deep_look_line(flavour, monitor.lines[1]) in mirrored_look(
        flavour, fault, replica), monitor.lines
    assert monitor._kept is None
    assert "train_step" not in vars(model)


# Whether `fit` with jit_compile=True under MirroredStrategy keeps batches:
# Keras 3 runs every replica's step inside one compiled function, tf_keras
# compiles each replica's apart (their dicts would differ, and fit would
# sum them).
JIT_UNKEPT = {"keras3": None, "tf_keras": (
    "tf_keras' fit with jit_compile=True under several replicas compiles "
    "each replica's step apart")}


def test_which_mirrored_fits_keep_no_batch(flavour, mirrored_strategy):
    """Where no batch can be kept, `install` says why and leaves the
    model as it was (the monitor prints the reason at the first skipped
    step). Compiled only: neither `jit_compile=True` fit runs on two CPUs."""
    with mirrored_strategy.scope():
        model = nf.small_mlp(flavour.keras)
        model.compile(optimizer=tf_lossscale.LossScaleOptimizer(
            flavour.keras.optimizers.SGD(1e-3)), loss="mse",
            jit_compile=True)
    assert deep_look.unkept_reason(model) == JIT_UNKEPT[flavour.name]
    if JIT_UNKEPT[flavour.name] is None:
        return
    model.make_train_function()
    own = model.train_function
    kept = deep_look.KeptBatch()
    assert kept.install(model) == JIT_UNKEPT[flavour.name]
    assert model.train_function is own and "train_step" not in vars(model)


def _mirrored_state(flavour: Flavour, model: Any, opt: Any
                    ) -> List[np.ndarray]:
    """Every replica's value of every variable training carries: the
    model's, the Dropout's seed state, the optimizer's (slots,
    `iterations`, the scale), the metrics' (the compiled loss's too)."""
    seed = SEED_STATE[flavour.name](model.get_layer("drop"))
    variables = (list(model.variables) + [seed]
                 + list(OPTIMIZER_VARIABLES[flavour.name](opt))
                 + [v for m in model.metrics for v in m.variables])
    return [value for v in variables for value in replica_values(v)]


def test_the_deep_look_under_mirrored_strategy_changes_nothing(
        flavour, mirrored_strategy):
    """Two runs of fit under MirroredStrategy from the same seed, one with
    the deep look: a NaN in a row of replica 1's half of batches 1 and 5
    (two looks), a Dropout drawing on every replica in every step, a
    metric; afterwards every replica's value of every variable is equal
    (weights, slots, scale, `iterations`, seed state, metrics)."""
    k = flavour.keras
    x, y = nf.data(nan_row=nf.BATCH + nf.BATCH // 2 + 1, rows=4 * nf.BATCH)
    states, monitors = [], []
    for look in (True, False):
        k.utils.set_random_seed(0)
        with mirrored_strategy.scope():
            model = nf.dropout_mlp(k, **DROPOUT_ARGUMENTS[flavour.name])
            opt = tf_lossscale.LossScaleOptimizer(
                k.optimizers.Adam(1e-2), initial_scale=2.0**10)
            model.compile(optimizer=opt, loss="mse", metrics=["mae"])
        monitor = tf_lossscale.LossScaleMonitor(report=False,
                                                deep_look=look)
        model.fit(x, y, batch_size=nf.BATCH, epochs=2, shuffle=False,
                  verbose=0, callbacks=[monitor])
        states.append(_mirrored_state(flavour, model, opt))
        monitors.append(monitor)
        iterations = int(replica_values(opt.iterations)[0])
        assert (float(opt.loss_scale), iterations, int(opt.skipped_steps)
                ) == (2.0**8, 8, 2)
    looked, plain = states
    assert len(looked) == len(plain) > 2 * len(model.variables)
    for before, after in zip(looked, plain):
        np.testing.assert_array_equal(before, after)
    deep = [deep_look_line(flavour, line) for line in monitors[0].lines
            if line.startswith("deep look")]
    assert deep == [mirrored_look(flavour, "nan", 1, step)[0]
                    for step in (1, 5)], deep


# What a module of each side imports to run the tests above.
__all__ = [name for name in dir() if name.startswith("test_")]
