"""Exact resume after SIGKILL, and checkpoints that cross implementations.

`tests/_resume_worker.py` trains with saves every 5 steps; the test kills
it with SIGKILL mid-run, starts it again on the same directory, and the
final weights, slots, scale, counter and iterations must be bit-identical
to an uninterrupted run (deterministic ops on). Saving does not change
training, so one uninterrupted run serves both save formats.

Then checkpoint interchange: our optimizer's state and Keras 3's or
TensorFlow's own restore into each other where the state means the same;
where it does not, TensorFlow's restore status names the keys.
"""

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_lossscale

TESTS = Path(__file__).resolve().parent
WORKER = TESTS / "_resume_worker.py"
ROOT = TESTS.parent
TIME_LIMIT = 120.0
STEPS, EVERY = 24, 5


def _worker_command(fmt, directory, out, stall_after=-1):
    return [sys.executable, str(WORKER), "--format", fmt, "--dir",
            str(directory), "--steps", str(STEPS), "--every", str(EVERY),
            "--stall-after", str(stall_after), "--out", str(out)]


def _start(command):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join(
                   [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)


def _kill(proc):
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run_to_end(command):
    """Runs the worker to its end; returns its output."""
    proc = _start(command)
    try:
        out, _ = proc.communicate(timeout=TIME_LIMIT)
    except subprocess.TimeoutExpired:
        _kill(proc)
        pytest.fail(f"{command} did not finish in {TIME_LIMIT} s")
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-5000:]
    return text


def run_until_then_sigkill(command, marker):
    """Starts the worker, SIGKILLs it once it has printed `marker`."""
    proc = _start(command)
    seen, deadline = b"", time.monotonic() + TIME_LIMIT
    try:
        while marker.encode() + b"\n" not in seen:
            remaining = deadline - time.monotonic()
            ready, _, _ = select.select([proc.stdout], [], [],
                                        max(0.0, remaining))
            chunk = os.read(proc.stdout.fileno(), 4096) if ready else b""
            if not chunk:
                pytest.fail(f"worker ended or stalled before {marker!r}:\n"
                            f"{seen.decode(errors='replace')[-5000:]}")
            seen += chunk
    finally:
        _kill(proc)
    assert proc.returncode == -signal.SIGKILL
    return seen.decode(errors="replace")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The final state of a run that nothing interrupted."""
    directory = tmp_path_factory.mktemp("uninterrupted")
    out = directory / "final.json"
    run_to_end(_worker_command("checkpoint", directory / "saves", out))
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("fmt, stall_after, resumed_from", [
    ("checkpoint", 12, "ckpt-10"),
    ("keras", 17, "model_15.keras"),
], ids=["tf_train_checkpoint", "keras_file"])
def test_sigkill_then_resume_is_bit_identical_to_an_uninterrupted_run(
        tmp_path, uninterrupted, fmt, stall_after, resumed_from):
    saves, out = tmp_path / "saves", tmp_path / "final.json"
    run_until_then_sigkill(
        _worker_command(fmt, saves, out, stall_after=stall_after),
        f"step {stall_after} done")
    assert not out.exists()
    log = run_to_end(_worker_command(fmt, saves, out))
    start = int(resumed_from.split("-")[-1].split("_")[-1].split(".")[0])
    assert f"start at step {start} from " in log and resumed_from in log, log
    resumed = json.loads(out.read_text())
    assert resumed == uninterrupted
    # The run was not trivial: NaN steps moved the scale both ways.
    assert resumed["iterations"] == STEPS
    assert resumed["optimizer_class"] == "KerasLossScaleOptimizer"


# Checkpoint interchange, in this process.

GRADS = ([16.0, 16.0], [np.nan, 1.0], [8.0, 8.0], [8.0, 8.0])


def _ours(dynamic=True):
    inner = keras.optimizers.SGD(0.1, momentum=0.9)
    if dynamic:
        return tf_lossscale.LossScaleOptimizer(
            inner, initial_scale=16.0, dynamic_growth_steps=5)
    return tf_lossscale.LossScaleOptimizer(
        inner, dynamic=False, initial_scale=16.0)


def _keras_own():
    return keras.mixed_precision.LossScaleOptimizer(
        keras.optimizers.SGD(0.1, momentum=0.9), initial_scale=16.0,
        dynamic_growth_steps=5)


def _scale_and_counter(opt):
    if isinstance(opt, tf_lossscale.LossScaleOptimizer):
        if not opt.dynamic:
            return float(opt.loss_scale), None
        return float(opt.loss_scale), int(opt.dynamic_counter)
    return float(opt.dynamic_scale.numpy()), int(opt.step_counter.numpy())


def _trained(make):
    var = keras.Variable([1.0, 2.0])
    opt = make()
    for grad in GRADS:
        opt.apply_gradients([(tf.constant(grad), var)])
    return var, opt


def _inner_state(opt):
    return [np.asarray(v).tobytes() for v in opt.inner_optimizer.variables]


def _restore(make, path):
    var = keras.Variable([0.0, 0.0])
    opt = make()
    opt.build([var])
    status = tf.train.Checkpoint(var=var, optimizer=opt).read(path)
    return var, opt, status


@pytest.mark.parametrize("writer, reader", [
    (_ours, _keras_own), (_keras_own, _ours)],
    ids=["ours_to_keras3", "keras3_to_ours"])
def test_keras3_checkpoints_restore_both_ways(tmp_path, writer, reader):
    var, opt = _trained(writer)
    # Keras' own skips without advancing iterations; scale and counter agree.
    assert _scale_and_counter(opt) == (8.0, 2)
    path = tf.train.Checkpoint(var=var, optimizer=opt).write(
        str(tmp_path / "ckpt"))
    new_var, new_opt, status = _restore(reader, path)
    status.assert_consumed()
    assert _scale_and_counter(new_opt) == (8.0, 2)
    assert _inner_state(new_opt) == _inner_state(opt)
    assert new_var.numpy().tobytes() == var.numpy().tobytes()


def test_dynamic_checkpoint_into_fixed_scale_names_the_unused_keys(tmp_path):
    var, opt = _trained(_ours)
    path = tf.train.Checkpoint(var=var, optimizer=opt).write(
        str(tmp_path / "ckpt"))
    _, fixed, status = _restore(lambda: _ours(dynamic=False), path)
    with pytest.raises(AssertionError,
                       match=r"optimizer/(step_counter|dynamic_scale)"):
        status.assert_consumed()
    status.expect_partial()
    # What has the same meaning (the inner optimizer) was restored.
    assert _inner_state(fixed) == _inner_state(opt)
    assert _scale_and_counter(fixed) == (16.0, None)


def test_fixed_checkpoint_into_dynamic_names_the_missing_variables(tmp_path):
    var, opt = _trained(lambda: _ours(dynamic=False))
    path = tf.train.Checkpoint(var=var, optimizer=opt).write(
        str(tmp_path / "ckpt"))
    _, dynamic, status = _restore(_ours, path)
    with pytest.raises(AssertionError) as raised:
        status.assert_existing_objects_matched()
    assert "step_counter" in str(raised.value)
    assert "dynamic_scale" in str(raised.value)
    assert _inner_state(dynamic) == _inner_state(opt)
    assert _scale_and_counter(dynamic) == (16.0, 0)


# TF1: name-based `Saver` checkpoints of TensorFlow's own wrapper and ours.

V1 = tf.compat.v1


WRAPPERS = {
    "ours": (tf_lossscale.MixedPrecisionLossScaleOptimizer,
             tf_lossscale.DynamicLossScale),
    "tensorflow": (V1.mixed_precision.MixedPrecisionLossScaleOptimizer,
                   V1.mixed_precision.DynamicLossScale),
}


def _good_steps(loss_scale):
    if isinstance(loss_scale, tf_lossscale.DynamicLossScale):
        return loss_scale.good_steps
    return loss_scale._num_good_steps  # TensorFlow's class keeps it private.


def _tf1_graph(name):
    """A TF1 graph training one variable with a loss-scale wrapper around
    Momentum; the loss `sum(grad * w)` has the fed `grad` as gradient."""
    wrapper, loss_scale_class = WRAPPERS[name]
    graph = tf.Graph()
    with graph.as_default():
        var = V1.get_variable("w", initializer=[1.0, 2.0], use_resource=True)
        grad = V1.placeholder(tf.float32, [2])
        loss_scale = loss_scale_class(
            initial_loss_scale=16.0, increment_period=5, multiplier=2.0)
        inner = V1.train.MomentumOptimizer(0.1, 0.9)
        opt = wrapper(inner, loss_scale)
        train_op = opt.minimize(tf.reduce_sum(grad * var), var_list=[var])
        fetch = {"var": var, "momentum": inner.get_slot(var, "momentum"),
                 "scale": loss_scale(), "good_steps": _good_steps(loss_scale)}
        saver = V1.train.Saver()
        init = V1.global_variables_initializer()
    return graph, grad, train_op, fetch, saver, init


@pytest.mark.parametrize("writer, reader", [
    ("tensorflow", "ours"), ("ours", "tensorflow")],
    ids=["tensorflow_to_ours", "ours_to_tensorflow"])
def test_tf1_saver_checkpoints_restore_both_ways(tmp_path, writer, reader):
    graph, grad, train_op, fetch, saver, init = _tf1_graph(writer)
    with V1.Session(graph=graph) as sess:
        sess.run(init)
        for value in ([1.0, 1.0], [np.inf, 1.0], [0.5, 0.5]):
            sess.run(train_op, {grad: value})
        saved = sess.run(fetch)
        path = saver.save(sess, str(tmp_path / "model"))
    assert (saved["scale"], saved["good_steps"]) == (8.0, 1)
    assert sorted(name for name, _ in tf.train.list_variables(path)) == [
        "current_loss_scale", "good_steps", "w", "w/Momentum"]

    graph, _, _, fetch, saver, _ = _tf1_graph(reader)
    with V1.Session(graph=graph) as sess:
        saver.restore(sess, path)
        restored = sess.run(fetch)
    for key in saved:
        assert np.asarray(restored[key]).tobytes() == \
            np.asarray(saved[key]).tobytes(), key
