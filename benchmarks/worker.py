"""Runs the workloads for one Keras in this process and writes JSON.

    python benchmarks/worker.py --keras {keras3,tf_keras} --mode MODE --out F

tf_keras must be chosen before TensorFlow is imported
(`TF_USE_LEGACY_KERAS=1`), so each Keras gets its own process; `run.py`
starts both. Each flavour is compared with its own original in its own
process (the original is `keras3` or `tf_keras`, the Keras of this
process). The workloads, each in the module that builds its rows:

- (a) and (e), `workload_fit.py`: `compile` + `train_on_batch` of an MLP,
  without and with XLA;
- (b) and (f), `workload_loop.py`: a custom `GradientTape` loop over many
  small variables, without and with XLA;
- (c) and (d), `workload_check.py`: check+unscale alone, timed, and its
  XLA fusions;
- (g) and (h), `workload_transformer.py`: `compile` + `train_on_batch` of
  a small transformer with Dropout, without and with XLA.

The optimizers of the rows (plain, barrier, limit, the original, ours) and
the loop's step are in `rows.py`; sizes and timing in `common.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List

ARGS = None


def _parse(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keras", choices=["keras3", "tf_keras"],
                        required=True)
    parser.add_argument("--mode", default="quick")
    parser.add_argument("--workloads", default="abcdefgh")
    parser.add_argument("--out", required=True)
    parser.add_argument("--record-cost", action="store_true")
    return parser.parse_args(argv)


if __name__ == "__main__":
    ARGS = _parse(sys.argv[1:])
    if ARGS.keras == "tf_keras":
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
    else:
        os.environ.pop("TF_USE_LEGACY_KERAS", None)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import common  # noqa: E402
import rows  # noqa: E402
import workload_check  # noqa: E402
import workload_fit  # noqa: E402
import workload_loop  # noqa: E402
import workload_transformer  # noqa: E402

tf.get_logger().setLevel("ERROR")

if ARGS is not None and ARGS.keras == "tf_keras":
    import tf_keras as keras  # noqa: E402
else:
    import keras  # noqa: E402


def run(args: argparse.Namespace) -> Dict[str, Any]:
    """Every workload asked for, in the order of the report."""
    sizes = common.MODES[args.mode]
    keras.utils.set_random_seed(0)  # once, before anything is traced
    result: Dict[str, Any] = {"keras": args.keras, "mode": args.mode,
                              "versions": {"tensorflow": tf.__version__,
                                           "keras": keras.__version__}}
    if "a" in args.workloads:
        result["a"] = {opt: workload_fit.workload_a(keras, sizes, opt)
                       for opt in sizes.optimizers}
    if "b" in args.workloads:
        result["b"] = workload_loop.workload_b(keras, sizes)
    if "c" in args.workloads:
        result["c"] = workload_check.workload_c(keras, sizes)
    if "d" in args.workloads:
        result["d"] = workload_check.workload_d(keras, sizes)
    if "e" in args.workloads:
        result["e"] = {opt: workload_fit.workload_e(keras, sizes, opt)
                       for opt in sizes.optimizers}
    if "f" in args.workloads:
        result["f"] = workload_loop.workload_f(keras, sizes)
    for letter, xla in (("g", False), ("h", True)):
        if letter in args.workloads:
            result[letter] = {
                opt: workload_transformer.workload(keras, sizes, opt, xla)
                for opt in sizes.transformer_optimizers}
    return result


def main() -> int:
    assert ARGS is not None, "run as a script"
    rows.WITH_NO_RECORD_ROW = ARGS.record_cost
    result = run(ARGS)
    with open(ARGS.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
