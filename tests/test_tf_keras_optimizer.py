"""The tf_keras flavour of LossScaleOptimizer, tested in processes of its own.

tf_keras is only `tf.keras` when `TF_USE_LEGACY_KERAS=1` is set before
TensorFlow is imported, and this process imported TensorFlow long ago. So
each module of `tests/tf_keras_cases/` runs here as `python -m pytest` in a
subprocess with that variable set; a failure shows the subprocess's output.
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
CASES = sorted((ROOT / "tests" / "tf_keras_cases").glob("cases_*.py"))


def test_every_case_module_is_found():
    assert {p.name for p in CASES} >= {
        "cases_optimizer.py", "cases_distributed.py", "cases_saving.py"}


@pytest.mark.parametrize("module", CASES, ids=lambda p: p.stem)
def test_tf_keras_cases_pass_under_legacy_keras(module):
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
