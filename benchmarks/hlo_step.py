"""What one XLA-compiled training step is made of, with and without a scaler.

    python benchmarks/hlo_step.py [--keras keras3|tf_keras] [--layers 8]
        [--width 512] [--model mlp|transformer] [--mode full]
        [--dump DIR] [--json PATH]

Compiles one `train_step` (what `fit` runs with `jit_compile=True`) of a
`layers` x Dense(`width`) MLP for each row (plain SGD/Adam, the limit, the
Keras original, tf_lossscale), or with `--model transformer` of the
benchmark's transformer with Dropout ((h) at `--mode`'s size: plain, the
original and ours, with each of the mode's `transformer_optimizers`), and
counts, in the optimized HLO
(`experimental_get_compiler_ir(...)(stage="optimized_hlo")`): instructions,
fusions, copies and the bytes they copy, conditionals (and the copies in
their branches), while loops, custom-calls and host transfers. These counts
are deterministic: unlike timings, the machine's load does not move them.
Not part of the suite's table; `--dump DIR` writes each row's HLO text.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

ARGS = None
if __name__ == "__main__":
    _p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _p.add_argument("--keras", choices=["keras3", "tf_keras"],
                    default="keras3")
    _p.add_argument("--layers", type=int, default=8)
    _p.add_argument("--width", type=int, default=512)
    _p.add_argument("--dump", default=None)
    _p.add_argument("--json", default=None)
    _p.add_argument("--rows", default=None,
                    help="comma-separated subset of rows")
    _p.add_argument("--model", choices=["mlp", "transformer"],
                    default="mlp")
    _p.add_argument("--mode", default="full",
                    help="the benchmark mode whose transformer to compile")
    ARGS = _p.parse_args()
    if ARGS.keras == "tf_keras":
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

LEGACY = os.environ.get("TF_USE_LEGACY_KERAS") == "1"
if LEGACY:
    import tf_keras as keras  # noqa: E402
else:
    import keras  # noqa: E402

import common  # noqa: E402
import rows  # noqa: E402
import workload_transformer  # noqa: E402

_BYTES = {"f32": 4, "f16": 2, "bf16": 2, "s64": 8, "u64": 8, "s32": 4,
          "u32": 4, "pred": 1, "s8": 1, "u8": 1, "f64": 8}
_INSTR = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (.*?) ([\w-]+)\(")
_COMP = re.compile(r"^(ENTRY )?%?([\w.\-]+) .*\{\s*$")


def _bytes(shape: str) -> int:
    total = 0
    for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", shape):
        n = int(np.prod([int(d) for d in dims.split(",") if d])) \
            if dims else 1
        total += n * _BYTES.get(dtype, 4)
    return total


def computations(hlo: str) -> Dict[str, List[tuple]]:
    """Computation name -> [(name, shape, opcode, line)] (ENTRY as 'ENTRY')."""
    comps: Dict[str, List[tuple]] = {}
    current = None
    for line in hlo.splitlines():
        m = _COMP.match(line)
        if m and not line[:1].isspace():
            current = "ENTRY" if m.group(1) else m.group(2)
            comps[current] = []
            continue
        m = _INSTR.match(line)
        if m and current is not None:
            comps[current].append((m.group(1), m.group(2), m.group(3), line))
    return comps


def count(hlo: str) -> Dict[str, Any]:
    """The counts this script reports, from optimized HLO text."""
    comps = computations(hlo)
    fused = set()
    for instrs in comps.values():
        for _, _, op, line in instrs:
            if op == "fusion":
                fused.update(re.findall(r"calls=%?([\w.\-]+)", line))
    # Computations that run as kernels: the entry, conditional branches,
    # while bodies/conditions, called computations (not fused bodies, not
    # reducers, which run inside a kernel).
    unfused = {name for name in comps if name not in fused}
    kernels: Dict[str, int] = {}
    copies: List[str] = []
    cond_copies: List[str] = []
    branches = set()
    for instrs in comps.values():
        for _, _, op, line in instrs:
            if op == "conditional":
                branches.update(re.findall(
                    r"(?:true|false)_computation=%?([\w.\-]+)", line))
                for group in re.findall(r"branch_computations=\{([^}]*)\}",
                                        line):
                    branches.update(b.strip().lstrip("%")
                                    for b in group.split(","))
    branch_names = set(branches)
    trivial = {"parameter", "constant", "tuple", "get-tuple-element",
               "bitcast"}
    top = 0
    in_branches = 0
    for name in unfused:
        if name != "ENTRY" and not any(
                name in line for instrs in comps.values()
                for _, _, op, line in instrs
                if op in ("conditional", "while", "call")):
            continue  # a reducer or other helper, not run as a kernel
        for _, shape, op, _line in comps[name]:
            if op in trivial:
                continue
            top += 1
            in_branches += name in branch_names
            kernels[op] = kernels.get(op, 0) + 1
            if op == "copy":
                copies.append(shape)
                if name in branch_names:
                    cond_copies.append(shape)
    total = sum(len(v) for v in comps.values())
    per_computation = {}
    for name in sorted(branch_names | {"ENTRY"}):
        ops = [(shape, op) for _, shape, op, _ in comps.get(name, [])
               if op not in trivial]
        per_computation[name] = {
            "kernels": len(ops),
            "fusions": sum(op == "fusion" for _, op in ops),
            "copy_bytes": sum(_bytes(sh) for sh, op in ops if op == "copy"),
            # What its kernels write (a conditional's outputs are written
            # by its branches, counted there).
            "bytes_written": sum(_bytes(sh) for sh, op in ops
                                 if op not in ("conditional", "while"))}
    return {
        "instructions": total,
        "kernels": top,
        "kernels_in_branches": in_branches,
        "fusions": kernels.get("fusion", 0),
        "copies": len(copies),
        "copy_bytes": sum(_bytes(s) for s in copies),
        "copies_in_branches": len(cond_copies),
        "copy_bytes_in_branches": sum(_bytes(s) for s in cond_copies),
        "conditionals": kernels.get("conditional", 0),
        "whiles": kernels.get("while", 0),
        "custom_calls": sum(op == "custom-call" for v in comps.values()
                            for _, _, op, _ in v),
        "host_transfers": sum(op in ("send", "recv", "send-done",
                                     "recv-done", "infeed", "outfeed")
                              for v in comps.values() for _, _, op, _ in v),
        "by_opcode": dict(sorted(kernels.items())),
        # The entry, and each conditional branch (which runs only when
        # taken): kernels, fusions and bytes copied in each.
        "per_computation": per_computation,
    }


def _mlp_steps() -> Iterator[Tuple[str, Any, Tuple[Any, ...]]]:
    """(key, compiled step, its arguments) for each MLP row."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, ARGS.width)).astype("float32")
    args = (tf.constant(x), tf.constant(np.zeros_like(x)))
    only = ARGS.rows.split(",") if ARGS.rows else None
    for opt in ("SGD", "Adam"):
        for flow in ("fit", "loop"):
            steps = rows.compiled_steps(
                keras, opt, flow, ARGS.layers, ARGS.width, only)
            for row, step in steps.items():
                yield f"{opt} {flow} {row}", step, args


def _transformer_steps() -> Iterator[Tuple[str, Any, Tuple[Any, ...]]]:
    """(key, compiled step, its arguments) for each transformer row: the
    model's own `train_step` under `jit_compile=True`, as `fit` runs it."""
    sizes = common.MODES[ARGS.mode]
    x, y = workload_transformer._batch(sizes)
    data = (tf.constant(x), tf.constant(y))
    weights = workload_transformer.transformer(keras, sizes).get_weights()
    only = ARGS.rows.split(",") if ARGS.rows else None
    for opt in sizes.transformer_optimizers:
        if common.optimizer_error(keras, opt):
            continue
        for row, make in rows.optimizer_makers(keras, opt, None).items():
            if only and row not in only:
                continue
            model = workload_transformer._compiled(
                keras, sizes, weights, make, True)
            model.train_on_batch(x, y)  # builds the optimizer's variables
            step = tf.function(model.train_step, jit_compile=True)
            yield f"{opt} fit {row}", step, (data,)


def main() -> int:
    keras.utils.set_random_seed(0)
    out: Dict[str, Any] = {}
    steps = (_transformer_steps() if ARGS.model == "transformer"
             else _mlp_steps())
    for key, step, args in steps:
        hlo = step.experimental_get_compiler_ir(*args)(
            stage="optimized_hlo")
        counts = count(hlo)
        out[key] = counts
        if ARGS.dump:
            Path(ARGS.dump).mkdir(parents=True, exist_ok=True)
            Path(ARGS.dump, key.replace(" ", "_") + ".hlo").write_text(hlo)
        print(f"{key:32s} " + " ".join(
            f"{k}={v}" for k, v in counts.items()
            if k not in ("by_opcode", "per_computation")), flush=True)
    if ARGS.json:
        Path(ARGS.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
