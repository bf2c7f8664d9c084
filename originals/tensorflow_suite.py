"""Run TensorFlow's own loss-scale test files on TensorFlow and on tf_lossscale.

The files are TensorFlow's, not ours, and are never committed (the folder
`originals/files/` is git-ignored). Fetch them from the public repository
tensorflow/tensorflow and save them verbatim as::

    originals/files/tensorflow/loss_scale_test.py
        <- tensorflow/python/training/experimental/loss_scale_test.py
           (measured at commit aeeb115816644ae91978ef16c6b38049592bc5e1)
    originals/files/tensorflow/loss_scale_optimizer_test.py
        <- tensorflow/python/training/experimental/loss_scale_optimizer_test.py
           (measured at commit 5eb09a1b60d1d0d5ab8bfaf1df5da56f7d47af5e)

Then run, from the repository root::

    python originals/tensorflow_suite.py          # as TensorFlow runs them
    python originals/tensorflow_suite.py --v1     # after disable_v2_behavior()
    python originals/tensorflow_suite.py --verbose  # each failure's message

With `--v1` every run first calls `tf.compat.v1.disable_v2_behavior()`, as
most TF1 scripts do, so the graph-mode halves of the tests run there.

Each file runs twice under pytest in a child process (`TF_CPP_MIN_LOG_LEVEL=2`,
`-p no:cacheprovider`, outcomes read from a junit xml): once as is, once with
the test module's `loss_scale_module` and `loss_scale_optimizer` names
replaced by a namespace of ours (`LossScale`, `FixedLossScale`,
`DynamicLossScale`, `get`, `serialize`, `deserialize`,
`MixedPrecisionLossScaleOptimizer`). No private name of TensorFlow's
modules is passed through: the files reach none at module level. They do
read two private attributes of the objects (`opt._loss_scale`,
`loss_scale._num_good_steps`), which ours answer to.

Compatibility aliases, installed in both runs before the files are imported,
for names today's TensorFlow renamed: the module
`tensorflow.python.distribute.distribution_strategy_context` is
`distribute_lib`, and `tensorflow.python.framework.ops.Tensor` is
`tensorflow.python.framework.tensor.Tensor`.

For each file it prints the pass counts of both runs and every test failing
on ours with its classification from `VERDICTS` (`deliberate`, `private`,
`message`, `unsupported`, `defect`; a failure not in the table is
`UNCLASSIFIED`), and exits 1 if any is a `defect` or `UNCLASSIFIED` (the
report is `_report.print_report`; `--verbose` prints every failure's
message).
"""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import _report

ROOT = Path(__file__).resolve().parent
FILES = ROOT / "files" / "tensorflow"
TEST_FILES = ("loss_scale_test.py", "loss_scale_optimizer_test.py")
SWAPPED_NAMES = ("loss_scale_module", "loss_scale_optimizer")

# Test id ("Class.test") -> (classification, why); see `_report.lookup`.
# Empty: every test passes.
VERDICTS: Dict[str, _report.Verdict] = {}


def _install_aliases() -> None:
    """Aliases for names the files import that TensorFlow has renamed."""
    from tensorflow.python.distribute import distribute_lib
    from tensorflow.python.framework import ops, tensor

    sys.modules.setdefault(
        "tensorflow.python.distribute.distribution_strategy_context",
        distribute_lib)
    if not hasattr(ops, "Tensor"):
        ops.Tensor = tensor.Tensor


def _ours() -> types.SimpleNamespace:
    import tf_lossscale as ours

    names = ("LossScale", "FixedLossScale", "DynamicLossScale", "get",
             "serialize", "deserialize", "MixedPrecisionLossScaleOptimizer")
    return types.SimpleNamespace(**{n: getattr(ours, n) for n in names})


class _Swap:
    """pytest plugin: points the test modules' names at our namespace."""

    def pytest_collection_modifyitems(self, items: List[object]) -> None:
        namespace, swapped = _ours(), 0
        for module in _report.collected_modules(items):
            for name in SWAPPED_NAMES:
                if hasattr(module, name):
                    setattr(module, name, namespace)
                    swapped += 1
        if not swapped:  # else "ours" would silently test TensorFlow's
            raise RuntimeError(f"no test module has any of {SWAPPED_NAMES}")


def _child(flavour: str, test_file: str, v1: bool, junit: str) -> int:
    """Runs one file under pytest in this process (the child)."""
    import pytest

    if v1:
        import tensorflow as tf

        tf.compat.v1.disable_v2_behavior()
    _install_aliases()
    plugins = [_Swap()] if flavour == "ours" else []
    return int(pytest.main(
        ["-q", "-n", "0", "-p", "no:cacheprovider", junit, "--rootdir",
         str(FILES),
         test_file], plugins=plugins))


def _run(flavour: str, test_file: Path, v1: bool
         ) -> Dict[str, _report.Outcome]:
    """Runs one file in a child process; returns outcomes by "Class.test"."""
    return _report.run_pytest(
        [__file__, "--child", flavour, str(test_file), "v1" if v1 else "v2"],
        dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), what=flavour, cwd=FILES,
        qualified=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs every file twice and prints the comparison of each."""
    args = _report.parse_args(__doc__, argv, {
        "--v1": "call tf.compat.v1.disable_v2_behavior() first"})
    status = 0
    for name in TEST_FILES:
        path = FILES / name
        if not path.exists():
            sys.exit(f"{path} is missing; see this module's docstring or "
                     "originals/README.md")
        original = _run("original", path, args.v1)
        ours = _run("ours", path, args.v1)
        print(f"{name}:")
        status |= _report.print_report(
            original, ours,
            lambda outcome: _report.lookup(outcome.name, VERDICTS),
            original_label="TensorFlow's classes",
            original_short="TensorFlow", skipped_note="pytest collects "
            "TestCase.test_session, a helper, and skips it",
            verbose=args.verbose)
    return status


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--child":
        # argv: --child FLAVOUR FILE v1|v2 --junitxml=XML (see `_run`).
        sys.exit(_child(sys.argv[2], sys.argv[3], v1=sys.argv[4] == "v1",
                        junit=sys.argv[5]))
    sys.exit(main())
