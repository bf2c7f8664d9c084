"""`python -m tf_lossscale bench`: runs the repository's benchmark suite.

The suite lives in `benchmarks/` at the root of the source checkout (it is
not part of the installed package: it compares against Keras' and tf_keras'
own optimizers and starts worker processes). This module finds it next to
the package and runs `benchmarks/run.py` with the same Python.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import List, Optional

__all__ = ["find_suite", "run"]


def find_suite() -> Optional[Path]:
    """`benchmarks/run.py` of the checkout this package runs from, or None."""
    root = Path(__file__).resolve().parent.parent
    candidate = root / "benchmarks" / "run.py"
    return candidate if candidate.is_file() else None


def run(quick: bool, json_path: Optional[str], xla: bool = False,
        record_cost: bool = False) -> int:
    """Runs the suite; prints its markdown report. Returns the exit code.

    Args:
      quick: every row and target on smaller workloads, fewer steps
        (about 23 minutes on two cores; 11 with `xla`).
      json_path: if given, every number is also written there as JSON.
      xla: only the rows compiled with XLA (`jit_compile=True`, Keras 3's
        default for `fit` on a GPU).
      record_cost: also time ours without the skip record, in every
        workload (what the record costs, in one run).
    """
    suite = find_suite()
    if suite is None:
        print("tf_lossscale bench: the benchmark suite (benchmarks/run.py) "
              f"was not found next to {Path(__file__).resolve().parent}. It "
              "ships with the source checkout only: clone the repository, "
              "install it editable (pip install -e .) and run the command "
              "there, or run `python benchmarks/run.py` from the checkout.",
              file=sys.stderr)
        return 2
    argv: List[str] = [sys.executable, str(suite)]
    if quick:
        argv.append("--quick")
    if xla:
        argv.append("--xla")
    if record_cost:
        argv.append("--record-cost")
    if json_path:
        argv += ["--json", str(Path(json_path).resolve())]
    return subprocess.call(argv)
