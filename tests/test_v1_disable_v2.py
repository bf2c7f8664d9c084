"""TF1 graph-mode cases in a process that calls disable_v2_behavior() first.

Most TF1 scripts start with `tf.compat.v1.disable_v2_behavior()`; after it
shapes hold `Dimension` objects, variables are reference variables and
control flow is TF1's, and it cannot be undone in this process. So
`tests/_v1_disable_v2_cases.py` runs as a script in a subprocess (once for
this module) and reports each of its `case_*` functions; each is one test
here. The cases cover `MixedPrecisionLossScaleOptimizer.minimize` with
dynamic and fixed scales (compared with TensorFlow's own class),
`DynamicLossScale.update` ops, sparse gradients, float16 variables, and
`Saver` and object-based checkpoints between ours and TensorFlow's.
"""

import ast
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "_v1_disable_v2_cases.py"
CASES = sorted(
    node.name for node in ast.parse(SCRIPT.read_text()).body
    if isinstance(node, ast.FunctionDef) and node.name.startswith("case_"))

# Cases waiting for a library fix: {case: the defect}. None is open.
XFAIL: dict = {}


@pytest.fixture(scope="module")
def results():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    run = subprocess.run([sys.executable, str(SCRIPT)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    line = [x for x in run.stdout.splitlines() if x.startswith("RESULTS ")]
    assert run.returncode == 0 and line, run.stderr[-10000:]
    return json.loads(line[-1][len("RESULTS "):]), run.stderr


def test_every_case_reported(results):
    assert sorted(results[0]) == CASES
    assert len(CASES) >= 10


@pytest.mark.parametrize("case", [
    pytest.param(name, marks=pytest.mark.xfail(
        strict=True, raises=AssertionError, reason=XFAIL[name]))
    if name in XFAIL else name for name in CASES])
def test_case_passes_after_disable_v2_behavior(results, case):
    outcome, stderr = results
    assert outcome[case] == "ok", f"{case}: {outcome[case]}\n{stderr[-6000:]}"
