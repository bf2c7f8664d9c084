"""Two real worker processes under `MultiWorkerMirroredStrategy`.

The test starts both workers itself (`tests/_multiworker_worker.py`, with
`TF_CONFIG` naming two workers on 127.0.0.1 and free ports), each in its own
process group, and kills any that outlives the time bound. The data of ONE
worker holds a NaN at one step. With tf_lossscale's optimizer both workers
must skip that step, finish with equal scale, counter, iterations and
bit-identical weights, and exit cleanly. Keras 3's own LossScaleOptimizer
takes each worker's local verdict, so the workers disagree: one skips while
the other waits in a collective, and the run does not end cleanly.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
WORKER = TESTS / "_multiworker_worker.py"
EXAMPLE = ROOT / "examples" / "multiworker.py"

TIME_LIMIT = 120.0  # seconds for a whole two-worker run
GRACE = 5.0  # seconds a worker may outlive a failed peer
STEPS = 6
NAN_STEP = 3  # 0-based step whose batch holds a NaN on worker 1


def free_ports(count: int) -> List[int]:
    """Ports the kernel reports free (bound to port 0, then released)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def tf_config(ports: List[int], index: int) -> str:
    workers = [f"127.0.0.1:{p}" for p in ports]
    return json.dumps({"cluster": {"worker": workers},
                       "task": {"type": "worker", "index": index}})


class Run:
    """What two workers did: exit codes (None = killed), results, logs."""

    def __init__(self, codes, results, logs, seconds):
        self.codes: List[Optional[int]] = codes
        self.results: List[Optional[Dict]] = results
        self.logs: List[str] = logs
        self.seconds: float = seconds

    @property
    def clean(self) -> bool:
        return self.codes == [0, 0] and None not in self.results

    def describe(self) -> str:
        tails = "\n".join(
            f"--- worker {i} exit {code} ---\n{log[-3000:]}"
            for i, (code, log) in enumerate(zip(self.codes, self.logs)))
        return f"after {self.seconds:.0f}s:\n{tails}"


def wait_or_kill(procs: List[subprocess.Popen], deadline: float,
                 grace: float = GRACE) -> List[Optional[int]]:
    """Exit codes of `procs`; None for each one killed (its process group)
    because the deadline passed, or `grace` seconds after a peer failed."""
    while True:
        codes = [proc.poll() for proc in procs]
        failed = any(code not in (None, 0) for code in codes)
        if None not in codes:
            return codes
        if failed:
            deadline = min(deadline, time.monotonic() + grace)
            grace = float("inf")  # Set the shortened deadline once.
        if time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return codes


def run_workers(script_args: List[str], tmp_path: Path,
                time_limit: float = TIME_LIMIT,
                script: Path = WORKER) -> Run:
    """Starts two workers, waits up to `time_limit`, kills what is left."""
    ports = free_ports(2)
    procs, outs, logs = [], [], []
    env_base = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                    PYTHONPATH=os.pathsep.join(
                        [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    start = time.monotonic()
    for index in range(2):
        out = tmp_path / f"worker{index}.json"
        log = open(tmp_path / f"worker{index}.log", "wb")
        env = dict(env_base, TF_CONFIG=tf_config(ports, index))
        procs.append(subprocess.Popen(
            [sys.executable, str(script), *script_args, "--out", str(out)],
            env=env, cwd=str(tmp_path), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True))
        outs.append(out)
        logs.append(log)
    codes = wait_or_kill(procs, start + time_limit)
    for log in logs:
        log.close()
    results = [json.loads(o.read_text()) if o.exists() else None
               for o in outs]
    texts = [(tmp_path / f"worker{i}.log").read_text(errors="replace")
             for i in range(2)]
    return Run(codes, results, texts, time.monotonic() - start)


def worker_args(optimizer: str, mode: str,
                collective_timeout: float) -> List[str]:
    return ["--optimizer", optimizer, "--mode", mode, "--steps", str(STEPS),
            "--nan-step", str(NAN_STEP), "--nan-worker", "1",
            "--collective-timeout", str(collective_timeout)]


def assert_both_skipped_in_step(run: Run) -> None:
    """Both workers ended cleanly, equal, and skipped exactly the NaN step."""
    assert run.clean, run.describe()
    first, second = run.results
    for key in ("scale", "counter", "iterations", "weights"):
        assert first[key] == second[key], (key, run.describe())
    assert first["history"] == second["history"]
    history = first["history"]
    # Skipped: weights unchanged, scale halved, counter restarted.
    assert history[NAN_STEP]["weights"] == history[NAN_STEP - 1]["weights"]
    assert history[NAN_STEP]["scale"] == history[NAN_STEP - 1]["scale"] / 2
    assert history[NAN_STEP]["counter"] == 0
    # Every other step changed the weights.
    changed = [history[i]["weights"] != history[i - 1]["weights"]
               for i in range(1, STEPS) if i != NAN_STEP]
    assert all(changed), history
    # iterations count every step, applied or skipped.
    assert [h["iterations"] for h in history] == list(range(1, STEPS + 1))
    assert first["iterations"] == STEPS


def assert_both_name_worker_1(run: Run) -> None:
    """Both workers' `last_skip` says the NaN was on worker 1, and which
    variables: the NaN input makes every gradient of the step NaN."""
    first, second = run.results
    assert first["last_skip"] == second["last_skip"], run.describe()
    assert (first["skip_worker"], first["skip_replica"]) == (1, 1)
    assert len(first["skip_names"]) == 4
    # The NaN is in the input: the loss is NaN where a scaling method saw
    # it; the gradients are counted, nearest the loss first.
    line = first["last_skip"]
    assert line.startswith(f"step {NAN_STEP} skipped on worker 1: "), line
    assert "4 of 4 gradients non-finite" in line, line
    nearest = first["skip_names"][0].rpartition("/")[0]
    assert f"non-finite, {nearest} .. " in line or (
        f"entered at {nearest}" in line), line


@pytest.mark.slow
def test_fit_nan_on_one_worker_is_skipped_by_both(tmp_path):
    run = run_workers(worker_args("ours", "fit", 60), tmp_path)
    assert_both_skipped_in_step(run)
    assert_both_name_worker_1(run)
    for result in run.results:  # The monitor printed it on both workers.
        assert result["monitor_lines"] == [
            result["last_skip"] + " -> " + _power_of_two(
                result["history"][NAN_STEP]["scale"])], run.describe()


def _power_of_two(scale: float) -> str:
    return f"2^{int(scale).bit_length() - 1}"


@pytest.mark.slow
def test_custom_loop_nan_on_one_worker_is_skipped_by_both(tmp_path):
    run = run_workers(worker_args("ours", "loop", 60), tmp_path)
    assert_both_skipped_in_step(run)
    assert_both_name_worker_1(run)


@pytest.mark.slow
def test_keras_own_optimizer_leaves_a_worker_waiting_in_a_collective(
        tmp_path):
    """Keras 3.15's LossScaleOptimizer: worker 1 skips, worker 0 waits.

    Each worker checks only its own gradients before the all-reduce, so at
    the NaN step worker 0 enters the gradient all-reduce and worker 1 does
    not. A collective timeout of 15 s turns the hang into an error; the
    peer still waiting is killed 5 s later.
    """
    run = run_workers(worker_args("keras", "fit", 15), tmp_path)
    equal = run.clean and all(
        run.results[0][k] == run.results[1][k]
        for k in ("scale", "counter", "weights"))
    assert not equal, run.describe()
    # Both trained normally up to the NaN step, so the harness works...
    for log in run.logs:
        assert f"step {NAN_STEP - 1} done" in log, run.describe()
    # ...and what went wrong is a worker waiting for its peer.
    waited = None in run.codes or any(
        "Collective has timed out" in log for log in run.logs)
    assert waited, run.describe()


@pytest.mark.slow
def test_readme_multiworker_example_runs_and_workers_agree(tmp_path):
    """examples/multiworker.py, as README shows it: both workers skip the
    NaN step (the scale halves once from 2**12) and end with equal weights."""
    proc = subprocess.Popen(
        [sys.executable, str(EXAMPLE), "--timeout", str(TIME_LIMIT - 10)],
        cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    try:
        out, _ = proc.communicate(timeout=TIME_LIMIT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"example did not finish in {TIME_LIMIT} s:\n{out}")
    assert proc.returncode == 0, out
    lines = [line for line in out.splitlines() if line.startswith("worker ")]
    assert len(lines) == 2, out
    for index, line in enumerate(lines):
        assert line.startswith(f"worker {index}: loss scale 2048.0, "
                               "iterations 10, weights sha256 "), out
    assert lines[0].split()[-1] == lines[1].split()[-1], out
