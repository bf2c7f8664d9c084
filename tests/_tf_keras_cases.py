"""Runs a module of `tests/tf_keras_cases/` as `python -m pytest` in a
subprocess with TF_USE_LEGACY_KERAS=1 (tf_keras is only `tf.keras` when that
is set before TensorFlow is imported, and the test process imported it long
ago).

The modules are split into three groups, one per test file, so that the
test suite's two workers (`--dist loadfile`) share them: one file of all of
them was the last and longest unit of a run.
"""

import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
CASES = ROOT / "tests" / "tf_keras_cases"
GROUPS = {
    "optimizer": ["cases_differential", "cases_knobs", "cases_own_suite"],
    "distributed": ["cases_distributed", "cases_optimizer", "cases_saving"],
    "legacy": ["cases_legacy", "cases_differential_bad_input",
               "cases_monitor", "cases_natural_faults", "cases_wrapped_inner"],
}


def modules(group):
    """The case modules of `group`, as paths."""
    return [CASES / f"{name}.py" for name in GROUPS[group]]


def run_case_module(module):
    """Runs `module`'s tests under tf_keras; fails with its output."""
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p",
         "no:cacheprovider", str(module.relative_to(ROOT))],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, (
        f"{module.name} failed under TF_USE_LEGACY_KERAS=1:\n"
        f"{output[-20000:]}")
    summary = re.search(r"(\d+) passed", output)
    assert summary and int(summary.group(1)) > 0, output[-5000:]
    assert not re.search(r"\d+ (skipped|xfailed|failed|error)", output), (
        output[-5000:])
