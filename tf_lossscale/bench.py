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

__all__ = ["PRESETS", "find_suite", "run"]

#: The presets, shortest first: what each runs and how long it takes on two
#: CPU cores (the help of `bench` prints these).
PRESETS = {
    "short": "fit (40 x Dense(512), SGD and Adam) without and with XLA, "
             "against Keras' own LossScaleOptimizer: about 5 minutes",
    "targets": "what a change to the step is checked against before it "
               "lands: fit without and with XLA, the documented custom-loop "
               "flow at 1500 variables and check+unscale of 33M floats, "
               "each with its target: 7 to 12 minutes",
    "quick": "every workload and target on smaller models, fewer steps "
             "(adds Keras 3's flow of the loop, the loop under XLA, small "
             "tensors, XLA fusion counts and a transformer with Dropout): "
             "about 16 minutes",
    "full": "every workload and target at full size (the loop at 1500 "
            "variables, 60 to 80 steps a row): the longest run, about 40 "
            "minutes",
}


def find_suite() -> Optional[Path]:
    """`benchmarks/run.py` of the checkout this package runs from, or None."""
    root = Path(__file__).resolve().parent.parent
    candidate = root / "benchmarks" / "run.py"
    return candidate if candidate.is_file() else None


def run(preset: str = "short", json_path: Optional[str] = None,
        xla: bool = False, record_cost: bool = False) -> int:
    """Runs the suite; prints its markdown report. Returns the exit code.

    Args:
      preset: a key of `PRESETS`: `short` (the default: fit without and
        with XLA against Keras' own, a few minutes on two cores),
        `targets` (what a change to the step is checked against), `quick`
        (every workload and target, smaller) or `full` (every workload at
        full size: the longest run).
      json_path: if given, every number is also written there as JSON.
      xla: only the preset's rows compiled with XLA (`jit_compile=True`,
        Keras 3's default for `fit` on a GPU).
      record_cost: also time ours without the skip record, in every
        workload (what the record costs, in one run).
    """
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {', '.join(PRESETS)}; got "
                         f"{preset!r}")
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
    if preset != "short":
        argv.append(f"--{preset}")
    if xla:
        argv.append("--xla")
    if record_cost:
        argv.append("--record-cost")
    if json_path:
        argv += ["--json", str(Path(json_path).resolve())]
    return subprocess.call(argv)
