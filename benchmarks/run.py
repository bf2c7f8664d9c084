"""The benchmark suite: tf_lossscale against Keras' own LossScaleOptimizer.

    python benchmarks/run.py [--quick] [--json PATH]
    python -m tf_lossscale bench [--quick] [--json PATH]   # the same

Starts one worker process for Keras 3 and then one for tf_keras (which must
be chosen before TensorFlow is imported), never both at once, and prints a
markdown report: one table per workload, the issue's targets, and the
machine's load average before and after (timings under load are noise).
See benchmarks/README.md for what each row measures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import common  # noqa: E402

LABELS = {
    "plain": "plain optimizer",
    "barrier": "plain + barrier (limit)",
    "ours": "tf_lossscale",
    "keras3": "Keras 3 LossScaleOptimizer",
    "tf_keras:plain": "tf_keras plain optimizer *",
    "tf_keras": "tf_keras LossScaleOptimizer *",
    "tf_keras:ours": "tf_lossscale, tf_keras flavour *",
    "ours skipped": "tf_lossscale, every step skipped",
    "keras3 skipped": "Keras 3, every step skipped",
    "tf_keras skipped": "tf_keras, every step skipped *",
    "tf_keras:ours skipped": "tf_lossscale tf_keras flavour, skipped *",
    "one read": "one read of all gradients (limit)",
    "one tensor": "one read, one concatenated tensor (limit) **",
}


# --- running the workers ----------------------------------------------------

def run_worker(keras: str, mode: str, workloads: str) -> Optional[dict]:
    """Runs worker.py for one Keras; its JSON, or None if it failed."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_USE_LEGACY_KERAS", None)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        code = subprocess.call(
            [sys.executable, str(HERE / "worker.py"), "--keras", keras,
             "--mode", mode, "--workloads", workloads, "--out", str(out)],
            env=env, cwd=str(HERE))
        if code != 0 or not out.exists():
            print(f"benchmark worker for {keras} failed (exit {code})",
                  file=sys.stderr)
            return None
        return json.loads(out.read_text())


# --- numbers ----------------------------------------------------------------

def _median(rows: dict, row: str) -> Optional[float]:
    return rows[row]["median_ms"] if row in rows else None


def overhead(rows: dict, row: str, base: str = "plain") -> Optional[float]:
    """Median step / median base step - 1."""
    value, ref = _median(rows, row), _median(rows, base)
    if value is None or ref is None:
        return None
    return value / ref - 1


def extra_ms(rows: dict, row: str, base: str = "plain") -> Optional[float]:
    value, ref = _median(rows, row), _median(rows, base)
    if value is None or ref is None:
        return None
    return value - ref


def _pct(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}%"


def _ms(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def _first(rows: dict, row: str) -> str:
    return f"{rows[row]['first_call_s']:.2f}" if row in rows else "n/a"


def merged_rows(k3: Optional[dict], tk: Optional[dict], *path: str
                ) -> Dict[str, dict]:
    """Rows of one workload from both processes; tf_keras' rows prefixed.

    tf_keras rows keep their own `plain` under `tf_keras:plain`, so each is
    compared with the plain step of its own process.
    """
    rows: Dict[str, dict] = {}
    for result, prefix in ((k3, ""), (tk, "tf_keras:")):
        node = result
        for key in path:
            node = None if node is None else node.get(key)
        for name, row in ((node or {}).get("rows") or {}).items():
            key = name if prefix == "" or name.startswith("tf_keras") \
                else prefix + name
            rows[key] = row
    return rows


BASES = ("plain", "tf_keras:plain")


def _base(row: str) -> str:
    return "tf_keras:plain" if row.startswith("tf_keras") else "plain"


def _ordered(rows: Dict[str, dict]) -> List[str]:
    order = [k for k in LABELS if k in rows]
    return ["plain"] * ("plain" in rows) + [k for k in order if k != "plain"]


# --- the report -------------------------------------------------------------

def table_a(k3: Optional[dict], tk: Optional[dict]) -> List[str]:
    sgd = merged_rows(k3, tk, "a", "SGD")
    adam = merged_rows(k3, tk, "a", "Adam")
    lines = ["| row | SGD ms | SGD overhead | SGD first call s "
             "| Adam ms | Adam overhead | Adam first call s |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for row in _ordered({**sgd, **adam}):
        cells = []
        for rows in (sgd, adam):
            if row in rows:
                cells += [_ms(_median(rows, row)),
                          _pct(overhead(rows, row, _base(row)))
                          if row not in BASES else "",
                          _first(rows, row)]
            else:
                cells += ["", "", ""]
        lines.append(f"| {LABELS[row]} | " + " | ".join(cells) + " |")
    return lines


def table_b(k3: Optional[dict], tk: Optional[dict]) -> List[str]:
    rows = merged_rows(k3, tk, "b")
    lines = ["| row | step ms | overhead | first call s |",
             "|---|---:|---:|---:|"]
    for row in _ordered(rows):
        ovh = "" if row in BASES else _pct(overhead(rows, row, _base(row)))
        lines.append(f"| {LABELS[row]} | {_ms(_median(rows, row))} | {ovh} "
                     f"| {_first(rows, row)} |")
    return lines


def _c_extra(rows: dict, row: str) -> Optional[float]:
    base = "plain one tensor" if row == "one tensor" else _base(row)
    return extra_ms(rows, row, base)


def table_c(k3: Optional[dict], tk: Optional[dict]) -> List[str]:
    big = merged_rows(k3, tk, "c", "big")
    small = merged_rows(k3, tk, "c", "small")
    lines = ["| row | big: ms | big: + ms over plain | big: first call s "
             "| small: ms | small: + ms over plain | small: first call s |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for row in _ordered({**big, **small}):
        cells = []
        for rows in (big, small):
            extra = "" if row in BASES else _ms(_c_extra(rows, row))
            cells += [_ms(_median(rows, row)), extra, _first(rows, row)]
        lines.append(f"| {LABELS[row]} | " + " | ".join(cells) + " |")
    return lines


def table_d(k3: Optional[dict], tk: Optional[dict]) -> List[str]:
    d3 = (k3 or {}).get("d", {}).get("per gradient count", {})
    dk = (tk or {}).get("d", {}).get("per gradient count", {})
    same = (k3 or {}).get("d", {}).get("same bytes", {})
    names = [("ours", "tf_lossscale kernel (jit_compile=True)", d3),
             ("same", "tf_lossscale kernel, 10**6 floats in n gradients",
              {n: {"same": v} for n, v in same.items()}),
             ("ours in a compiled caller",
              "tf_lossscale inside a caller compiled whole", d3),
             ("keras3", "Keras 3 check_finite + divide", d3),
             ("tf_keras", "tf_keras is_all_finite + unscale *", dk)]
    counts = sorted({int(n) for n in list(d3) + list(dk)})
    lines = ["| row | " + " | ".join(f"n = {n}" for n in counts) + " |",
             "|---|" + "---:|" * len(counts)]
    for key, label, source in names:
        cells = []
        for n in counts:
            found = source.get(str(n), {}).get(key)
            cells.append("n/a" if found is None else
                         f"{found['fusions']} ({found['kernels']})")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def targets(k3: Optional[dict]) -> List[dict]:
    """The issue's targets, each with its measurement and verdict."""
    out: List[dict] = []
    if not k3:
        return out

    def add(name: str, value: Optional[float], bound: Optional[float],
            show: str) -> None:
        met = None if value is None or bound is None else value <= bound
        out.append({"target": name, "measured": show, "value": value,
                    "bound": bound, "met": met})

    for opt in ("SGD", "Adam"):
        rows = merged_rows(k3, None, "a", opt)
        if not rows:
            continue
        ours, bar, ker = (overhead(rows, r) for r in
                          ("ours", "barrier", "keras3"))
        bound = None if None in (bar, ker) else bar + (ker - bar) / 4
        add(f"(a) {opt}: ours <= barrier + (Keras 3 - barrier) / 4", ours,
            bound, f"{_pct(ours)} vs {_pct(bound)} (barrier {_pct(bar)}, "
            f"Keras 3 {_pct(ker)})")
    rows = merged_rows(k3, None, "b")
    ours, ker = overhead(rows, "ours"), overhead(rows, "keras3")
    add("(b) ours <= Keras 3 / 3", ours, None if ker is None else ker / 3,
        f"{_pct(ours)} vs Keras 3 {_pct(ker)}")
    small = merged_rows(k3, None, "c", "small")
    ours, ker = extra_ms(small, "ours"), extra_ms(small, "keras3")
    n = k3.get("c", {}).get("small", {}).get("tensors", "?")
    add(f"(c, {n} tensors) ours <= Keras 3 / 3 (extra ms)", ours,
        None if ker is None else ker / 3,
        f"{_ms(ours)} ms vs Keras 3 {_ms(ker)} ms")
    big = merged_rows(k3, None, "c", "big")
    ours, one = extra_ms(big, "ours"), extra_ms(big, "one read")
    n = k3.get("c", {}).get("big", {}).get("tensors", "?")
    add(f"(c, {n} tensors) ours <= 1.3 x one read (extra ms)", ours,
        None if one is None else 1.3 * one,
        f"{_ms(ours)} ms vs one read {_ms(one)} ms")
    d = k3.get("d", {})
    per_count = [v["ours"]["fusions"]
                 for v in d.get("per gradient count", {}).values()
                 if "ours" in v]
    same = [v["fusions"] for v in d.get("same bytes", {}).values()]
    add("(d) ours: fusions do not grow with the number of gradients "
        "(same bytes)", max(same) if same else None,
        min(same) if same else None,
        f"{' / '.join(map(str, same))} at 10**6 floats; "
        f"{' / '.join(map(str, per_count))} at 1000 floats each")
    for label, path in (("(a) SGD", ("a", "SGD")), ("(a) Adam", ("a", "Adam")),
                        ("(b)", ("b",))):
        rows = merged_rows(k3, None, *path)
        if "ours" in rows and "keras3" in rows:
            add(f"{label} first call: ours <= Keras 3",
                rows["ours"]["first_call_s"], rows["keras3"]["first_call_s"],
                f"{rows['ours']['first_call_s']:.2f} s vs "
                f"{rows['keras3']['first_call_s']:.2f} s")
    rows = merged_rows(k3, None, "a", "SGD")
    skipped, taken = _median(rows, "ours skipped"), _median(rows, "ours")
    add("(a) SGD: a skipped step costs no more than a taken one", skipped,
        taken, f"{_ms(skipped)} ms vs {_ms(taken)} ms")
    return out


def _describe(k3: Optional[dict], tk: Optional[dict], mode: str) -> dict:
    source = k3 or tk or {}
    a = source.get("a", {}).get("SGD", {})
    b = source.get("b", {})
    c = source.get("c", {})
    sizes = common.MODES[mode]
    return {
        "a": f"compile + train_on_batch: {sizes.mlp_layers} x Dense("
             f"{sizes.mlp_width}) MLP, {a.get('parameters', '?')} "
             f"parameters in {a.get('variables', '?')} variables, batch "
             f"{sizes.mlp_batch}, {sizes.mlp_steps} interleaved steps",
        "b": f"tf.function GradientTape loop: {sizes.many_layers} x Dense("
             f"{sizes.many_width}, tanh), {b.get('variables', '?')} "
             f"variables, SGD, {sizes.many_steps} interleaved steps",
        "c": "isolated check+unscale: big = "
             f"{c.get('big', {}).get('tensors', '?')} tensors / "
             f"{c.get('big', {}).get('floats', '?')} floats, small = "
             f"{c.get('small', {}).get('tensors', '?')} tensors of 1000 "
             f"floats; {sizes.check_steps} interleaved calls",
        "d": "XLA fusions (all kernels in brackets) in the optimized HLO "
             "of check+unscale over n float32 gradients of 1000 elements",
    }


def report(k3: Optional[dict], tk: Optional[dict], mode: str,
           load: Dict[str, List[float]], seconds: float) -> str:
    v = (k3 or {}).get("versions", {})
    vk = (tk or {}).get("versions", {})
    desc = _describe(k3, tk, mode)
    # The run itself keeps about one core busy; judge the machine before it.
    busy = (load["before"] or [0])[0] > 0.5
    lines = [
        f"### Benchmark (`--{mode}`)" if mode != "full" else "### Benchmark",
        "",
        f"TensorFlow {v.get('tensorflow', '?')}, Keras "
        f"{v.get('keras', '?')}, tf_keras {vk.get('keras', '?')}; "
        f"{os.cpu_count()} CPUs ({platform.machine()}); load average "
        f"{load['before'][:1]} before, {load['after'][:1]} after"
        + (" (a busy machine: timings are noisy)" if busy else "")
        + f"; {seconds:.0f} s.",
        "",
        "Medians of interleaved steps; overhead = median step / median plain "
        "step - 1, in the same process. * tf_keras rows ran in their own "
        "process and are compared with its plain tf_keras step.",
        "",
        f"**(a)** {desc['a']}", "", *table_a(k3, tk), "",
        f"**(b)** {desc['b']}", "", *table_b(k3, tk), "",
        f"**(c)** {desc['c']}. Extra ms over the plain row (reading the "
        "gradients and returning them); ** over reading the one tensor.",
        "",
        *table_c(k3, tk), "",
        f"**(d)** {desc['d']}", "", *table_d(k3, tk), "",
        "**Targets**", "",
        "| target | measured | met |", "|---|---|---|",
    ]
    for t in targets(k3):
        met = {True: "yes", False: "**no**", None: "n/a"}[t["met"]]
        lines.append(f"| {t['target']} | {t['measured']} | {met} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="smaller (b), fewer steps: under 100 s")
    parser.add_argument("--json", metavar="PATH", default=None,
                        help="also write every number as JSON to PATH")
    parser.add_argument("--mode", choices=sorted(common.MODES), default=None,
                        help=argparse.SUPPRESS)
    parser.add_argument("--workloads", default="abcd",
                        help="a subset of abcd (default: all)")
    args = parser.parse_args(argv)
    mode = args.mode or ("quick" if args.quick else "full")
    start = time.perf_counter()
    load = {"before": common.load_average()}
    k3 = run_worker("keras3", mode, args.workloads)
    tk = run_worker("tf_keras", mode, args.workloads)
    load["after"] = common.load_average()
    seconds = time.perf_counter() - start
    text = report(k3, tk, mode, load, seconds)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"mode": mode, "load_average": load, "seconds": round(seconds, 1),
             "keras3": k3, "tf_keras": tk, "targets": targets(k3),
             "markdown": text}, indent=1))
    return 0 if k3 is not None and tk is not None else 1


if __name__ == "__main__":
    sys.exit(main())
