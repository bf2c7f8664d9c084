"""The benchmark suite: tf_lossscale against Keras' own LossScaleOptimizer.

    python benchmarks/run.py [--targets | --quick | --full] [--xla] ...
    python -m tf_lossscale bench [--targets | --quick | --full] ...  # same

Without a preset flag it runs the short preset (`tf_lossscale.bench.PRESETS`
says what each runs and how long it takes).

Starts one worker process for Keras 3 and then one for tf_keras (which must
be chosen before TensorFlow is imported), never both at once, and prints a
markdown report: one table per workload, issue 15's targets (each flavour
against its own original, from the same process), and the machine's load
average before and after (timings under load are noise).
See benchmarks/README.md for what each row measures.

Where things are made: the rows in the workers (`worker.py`, the entry of
a worker process; `workload_*.py`, one module per kind of step; `rows.py`,
the optimizers and steps every row is built from), the figures and their
intervals in `estimates.py`, the targets in `targets.py`, the Markdown
tables in `tables.py`, the report around them in `report.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import common  # noqa: E402
import estimates  # noqa: E402
from report import report  # noqa: E402
from targets import short_targets, targets, xla_targets  # noqa: E402
from tf_lossscale.bench import PRESETS  # noqa: E402


def run_worker(keras: str, mode: str, workloads: str,
               record_cost: bool = False) -> Optional[dict]:
    """Runs worker.py for one Keras; its JSON, or None if it failed."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_USE_LEGACY_KERAS", None)
    flags = common.MODES[mode].xla_flags
    if flags:
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {flags}".strip()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        code = subprocess.call(
            [sys.executable, str(HERE / "worker.py"), "--keras", keras,
             "--mode", mode, "--workloads", workloads, "--out", str(out)]
            + (["--record-cost"] if record_cost else []),
            env=env, cwd=str(HERE))
        if code != 0 or not out.exists():
            print(f"benchmark worker for {keras} failed (exit {code})",
                  file=sys.stderr)
            return None
        return json.loads(out.read_text())


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    preset = parser.add_mutually_exclusive_group()
    preset.add_argument("--targets", action="store_true",
                        help=PRESETS["targets"])
    preset.add_argument("--quick", action="store_true",
                        help=PRESETS["quick"])
    preset.add_argument("--full", action="store_true", help=PRESETS["full"])
    parser.add_argument("--json", metavar="PATH", default=None,
                        help="also write every number as JSON to PATH")
    parser.add_argument("--mode", choices=sorted(common.MODES), default=None,
                        help=argparse.SUPPRESS)
    parser.add_argument("--workloads", default=None,
                        help="a subset of abcdefgh (default: the preset's; "
                        "e and f are a and b compiled with XLA; g and h a "
                        "transformer with Dropout, without and with XLA)")
    parser.add_argument("--xla", action="store_true",
                        help="only the preset's XLA workloads (of e, f, h)")
    parser.add_argument("--record-cost", action="store_true",
                        help="also time ours without the skip record (the "
                        "step before issue 22) in every workload")
    args = parser.parse_args(argv)
    mode = args.mode or ("targets" if args.targets else
                         "quick" if args.quick else
                         "full" if args.full else "short")
    if args.workloads is None:
        args.workloads = common.MODES[mode].workloads
    if args.xla:
        args.workloads = "".join(w for w in args.workloads if w in "efh")
    estimates.use_resamples(common.MODES[mode].resamples)
    start = time.perf_counter()
    load = {"before": common.load_average()}
    k3 = run_worker("keras3", mode, args.workloads, args.record_cost)
    tk = run_worker("tf_keras", mode, args.workloads, args.record_cost)
    load["after"] = common.load_average()
    seconds = time.perf_counter() - start
    text = report(k3, tk, mode, load, seconds)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"mode": mode, "load_average": load, "seconds": round(seconds, 1),
             "keras3": k3, "tf_keras": tk, "targets": targets(k3, tk),
             "xla_targets": xla_targets(k3, tk),
             "short_targets": short_targets(k3, tk),
             "markdown": text}, indent=1))
    return 0 if k3 is not None and tk is not None else 1


if __name__ == "__main__":
    sys.exit(main())
