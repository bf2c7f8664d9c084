"""Runs many Python scripts as fresh processes that skip TensorFlow's import.

`python tests/_script_batch.py JOBS RESULTS` reads a JSON list of jobs
(`{"args": [...], "cwd": ...}`, `args` as after `python`: a script path and
its arguments, or `-m module ...`), imports TensorFlow, Keras and
tf_lossscale once, and runs each job in a process forked from that state,
one at a time. Each child is as fresh as `python script.py` would be for
what the scripts touch (global policies, eager or graph mode, logical
devices, the shim's patches: all set after the fork, in the child only);
what it shares is modules already imported, read-only. RESULTS receives a
JSON list of `{"returncode", "stdout", "stderr", "seconds"}`, in the jobs' order.

The legacy corpus runs about a hundred scripts: importing TensorFlow in
each would be most of the test suite's time. Set TF_USE_LEGACY_KERAS
before starting this process to run every job with tf_keras.
"""

import json
import os
import runpy
import signal
import sys
import tempfile
import time
import traceback
from typing import Any, Dict, List

import tensorflow as tf  # noqa: F401 - imported once, before the forks

if os.environ.get("TF_USE_LEGACY_KERAS") == "1":
    import tf_keras  # noqa: F401
    from _autograph_rules import leave_tf_keras_unconverted
    leave_tf_keras_unconverted()
import keras  # noqa: F401,E402

import tf_lossscale  # noqa: F401,E402
import tf_lossscale.compat  # noqa: F401,E402


def _run_in_child(args: List[str]) -> int:
    """What `python *args` does after start-up; its exit status."""
    try:
        if args[0] == "-m":
            sys.argv = [args[1], *args[2:]]
            sys.path[0] = os.getcwd()
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(args)
            sys.path[0] = os.path.dirname(os.path.abspath(args[0]))
            runpy.run_path(args[0], run_name="__main__")
    except SystemExit as exit_:
        code = exit_.code
        if code is None or isinstance(code, int):
            return code or 0
        print(code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001 - reported as the interpreter would
        traceback.print_exc()
        return 1
    return 0


def _run(job: Dict[str, Any]) -> Dict[str, Any]:
    """Forks, runs `job` in the child with its output in files; waits."""
    with tempfile.TemporaryFile("w+") as out, \
            tempfile.TemporaryFile("w+") as err:
        sys.stdout.flush()
        sys.stderr.flush()
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:  # The child: it never returns.
            code = 1
            try:
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                os.chdir(job["cwd"])
                signal.alarm(job.get("timeout", 600))  # A hung script dies.
                code = _run_in_child(job["args"])
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        out.seek(0)
        err.seek(0)
        return {"returncode": os.waitstatus_to_exitcode(status),
                "stdout": out.read(), "stderr": err.read(),
                "seconds": round(time.monotonic() - started, 2)}


def main(jobs_path: str, results_path: str) -> None:
    with open(jobs_path, encoding="utf-8") as f:
        jobs = json.load(f)
    results = [_run(job) for job in jobs]
    with open(results_path, "w", encoding="utf-8") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
