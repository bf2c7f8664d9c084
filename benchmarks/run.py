"""The benchmark suite: tf_lossscale against Keras' own LossScaleOptimizer.

    python benchmarks/run.py [--quick] [--json PATH]
    python -m tf_lossscale bench [--quick] [--json PATH]   # the same

Starts one worker process for Keras 3 and then one for tf_keras (which must
be chosen before TensorFlow is imported), never both at once, and prints a
markdown report: one table per workload, issue 15's targets (each flavour
against its own original, from the same process), and the machine's load
average before and after (timings under load are noise).
See benchmarks/README.md for what each row measures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import common  # noqa: E402

# The flavours: the Keras of each worker process, the key of its original
# (its own LossScaleOptimizer) and the prefix its rows get in a merged
# table (each is compared with the plain step of its own process).
FLAVOURS = (("Keras 3", "keras3", ""), ("tf_keras", "tf_keras", "tf_keras:"))

# Row key (after merging) -> label, in table order. Per-workload overrides
# below name what the (b) and (c) rows run.
LABELS = {
    "plain": "Keras 3: plain optimizer",
    "barrier": "Keras 3: plain + barrier (limit)",
    "limit": "Keras 3: plain + one all-finite read (limit)",
    "keras3": "Keras 3: its LossScaleOptimizer",
    "ours": "Keras 3: tf_lossscale",
    "ours documented": "Keras 3: tf_lossscale, documented flow",
    "keras3 skipped": "Keras 3: its LossScaleOptimizer, every step skipped",
    "ours skipped": "Keras 3: tf_lossscale, every step skipped",
    "one read": "Keras 3 process: one read of all gradients (limit)",
    "one tensor": "Keras 3 process: one read, one concatenated tensor "
                  "(limit) **",
    "tf_keras:plain": "tf_keras: plain optimizer *",
    "tf_keras:barrier": "tf_keras: plain + barrier (limit) *",
    "tf_keras:limit": "tf_keras: plain + one all-finite read (limit) *",
    "tf_keras": "tf_keras: its LossScaleOptimizer *",
    "tf_keras:ours": "tf_keras: tf_lossscale *",
    "tf_keras:ours documented": "tf_keras: tf_lossscale, documented flow *",
    "tf_keras skipped": "tf_keras: its LossScaleOptimizer, every step "
                        "skipped *",
    "tf_keras:ours skipped": "tf_keras: tf_lossscale, every step skipped *",
    "tf_keras:one read": "tf_keras process: one read of all gradients "
                         "(limit) *",
}
LABELS_B = {
    "keras3": "Keras 3: its LossScaleOptimizer (`scale_loss` + "
              "`apply_gradients`, its only flow)",
    "ours": "Keras 3: tf_lossscale, Keras 3 flow (`scale_loss` + "
            "`apply_gradients`)",
    "ours documented": "Keras 3: tf_lossscale, documented flow "
                       "(`get_scaled_loss`, `get_unscaled_gradients`, "
                       "`apply_gradients`)",
    "tf_keras": "tf_keras: its LossScaleOptimizer, documented flow *",
    "tf_keras:ours documented": "tf_keras: tf_lossscale, documented flow *",
}
LABELS_C = {
    "keras3": "Keras 3: `check_finite` + a divide per tensor",
    "ours": "Keras 3: tf_lossscale `get_unscaled_gradients` + its verdict",
    "tf_keras": "tf_keras: `get_unscaled_gradients` + `_is_all_finite` *",
    "tf_keras:ours": "tf_keras: tf_lossscale `get_unscaled_gradients` + "
                     "its verdict *",
}

BOOTSTRAP_RESAMPLES = 1000
INTERVAL = 0.90


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

Rows = Dict[str, dict]  # row key -> a worker's row (first_call_s, samples_ms)


class Estimate(NamedTuple):
    """A figure from medians, with its bootstrap interval."""

    value: float
    low: float
    high: float


def merged_rows(k3: Optional[dict], tk: Optional[dict], *path: str) -> Rows:
    """Rows of one workload from both processes; tf_keras' rows prefixed.

    tf_keras rows keep their own `plain` under `tf_keras:plain`, so each is
    compared with the plain step of its own process.
    """
    rows: Rows = {}
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


def _median(rows: Rows, row: str) -> Optional[float]:
    return rows[row]["median_ms"] if row in rows else None


def measure(rows: Rows, needs: Sequence[str], fn: Callable[..., float]
            ) -> Optional[Estimate]:
    """`fn(*medians of needs)`, and its interval over resampled rounds.

    The rows of one workload in one process are timed round-robin, so
    sample i of every row comes from the same round: resampling rounds
    (the same indices for every row) keeps what a round shares, such as a
    burst of load, in the comparison. None if a row is missing.
    """
    if any(r not in rows or not rows[r]["samples_ms"] for r in needs):
        return None
    samples = [rows[r]["samples_ms"] for r in needs]
    try:
        value = fn(*(statistics.median(s) for s in samples))
    except ZeroDivisionError:
        return None
    n = min(len(s) for s in samples)
    rng = random.Random(0)
    values = []
    for _ in range(BOOTSTRAP_RESAMPLES):
        idx = [rng.randrange(n) for _ in range(n)]
        try:
            values.append(fn(*(statistics.median([s[i] for i in idx])
                               for s in samples)))
        except ZeroDivisionError:
            continue
    if not values:
        return Estimate(value, value, value)
    values.sort()
    tail = (1 - INTERVAL) / 2
    return Estimate(value, values[int(tail * len(values))],
                    values[min(len(values) - 1,
                               int((1 - tail) * len(values)))])


def _ratio_minus_one(row: float, base: float) -> float:
    return row / base - 1


def overhead(rows: Rows, row: str, base: Optional[str] = None
             ) -> Optional[Estimate]:
    """Median step / median base step - 1 (base: plain of its process)."""
    return measure(rows, (row, base or _base(row)), _ratio_minus_one)


def extra_ms(rows: Rows, row: str, base: Optional[str] = None
             ) -> Optional[float]:
    value, ref = _median(rows, row), _median(rows, base or _base(row))
    if value is None or ref is None:
        return None
    return value - ref


def _pct(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}%"


def _pct_est(e: Optional[Estimate]) -> str:
    if e is None:
        return "n/a"
    return (f"{_pct(e.value)} [{100 * e.low:+.1f}, {100 * e.high:+.1f}]")


def _x_est(e: Optional[Estimate]) -> str:
    if e is None:
        return "n/a"
    return f"{e.value:.2f}x [{e.low:.2f}, {e.high:.2f}]"


def _ms(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def _first(rows: Rows, row: str) -> str:
    return f"{rows[row]['first_call_s']:.2f}" if row in rows else "n/a"


def _ordered(rows: Rows) -> List[str]:
    return [k for k in LABELS if k in rows]


def _label(row: str, overrides: Optional[Dict[str, str]] = None) -> str:
    return (overrides or {}).get(row, LABELS[row])


# --- the report -------------------------------------------------------------

def table_a(k3: Optional[dict], tk: Optional[dict], workload: str = "a"
            ) -> List[str]:
    per_opt = [(opt, merged_rows(k3, tk, workload, opt))
               for opt in ("SGD", "Adam")]
    per_opt = [(opt, rows) for opt, rows in per_opt if rows]
    head, rule = "| row |", "|---|"
    for opt, _ in per_opt:
        head += (f" {opt} ms | {opt} overhead [90%] | {opt} first call s |")
        rule += "---:|---:|---:|"
    lines = [head, rule]
    merged: Rows = {}
    for _, rows in per_opt:
        merged.update(rows)
    for row in _ordered(merged):
        cells = []
        for _, rows in per_opt:
            if row in rows:
                cells += [_ms(_median(rows, row)),
                          "" if row in BASES
                          else _pct_est(overhead(rows, row)),
                          _first(rows, row)]
            else:
                cells += ["", "", ""]
        lines.append(f"| {_label(row)} | " + " | ".join(cells) + " |")
    return lines


def table_b(k3: Optional[dict], tk: Optional[dict], workload: str = "b"
            ) -> List[str]:
    rows = merged_rows(k3, tk, workload)
    lines = ["| row | step ms | overhead [90%] | first call s |",
             "|---|---:|---:|---:|"]
    for row in _ordered(rows):
        ovh = "" if row in BASES else _pct_est(overhead(rows, row))
        lines.append(f"| {_label(row, LABELS_B)} | {_ms(_median(rows, row))}"
                     f" | {ovh} | {_first(rows, row)} |")
    return lines


def warm_up_line(k3: Optional[dict], tk: Optional[dict], *path: str
                 ) -> List[str]:
    """The one-layer twins' first calls: the one-off costs of a process."""
    parts = []
    for (flavour, _, _), result in zip(FLAVOURS, (k3, tk)):
        node = result
        for key in path:
            node = None if node is None else node.get(key)
        warm = (node or {}).get("warm_up_s")
        if warm:
            parts.append(f"{flavour}: " + ", ".join(
                f"{row} {sec:.2f}" for row, sec in warm.items()))
    if not parts:
        return []
    where = ", " + " ".join(path[1:]) if len(path) > 1 else ""
    return ["", f"Warm-up{where}, s (each row's one-layer twin, called once "
            "before the first calls: one-off costs of the process): "
            + "; ".join(parts) + "."]


def _c_extra(rows: Rows, row: str) -> Optional[float]:
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
        lines.append(f"| {_label(row, LABELS_C)} | " + " | ".join(cells)
                     + " |")
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


# --- issue 15's targets -----------------------------------------------------

def _target(name: str, rows: Rows, needs: Sequence[str],
            value: Callable[..., float], bound: Callable[..., float],
            show: Callable[[Estimate, Estimate], str]) -> dict:
    """A target `value <= bound`, both functions of the medians of `needs`.

    The verdict is on the medians; `noise` is True when the interval of
    value - bound holds zero (another run may well give the other verdict).
    """
    v = measure(rows, needs, value)
    b = measure(rows, needs, bound)
    d = measure(rows, needs, lambda *m: value(*m) - bound(*m))
    if v is None or b is None or d is None:
        return {"target": name, "measured": "n/a", "value": None,
                "bound": None, "met": None, "noise": None}
    return {"target": name, "measured": show(v, b), "value": v.value,
            "bound": b.value, "interval": [v.low, v.high],
            "difference_interval": [d.low, d.high], "met": v.value <= b.value,
            "noise": d.low <= 0 <= d.high}


def _first_call_target(name: str, rows: Rows, ours: str, original: str
                       ) -> Optional[dict]:
    if ours not in rows or original not in rows:
        return None
    mine, theirs = rows[ours]["first_call_s"], rows[original]["first_call_s"]
    return {"target": name, "measured": f"{mine:.3g} s vs {theirs:.3g} s",
            "value": mine, "bound": theirs, "met": mine <= theirs,
            "noise": None}


def targets(k3: Optional[dict], tk: Optional[dict]) -> List[dict]:
    """Issue 15's targets, each flavour against its own original."""
    out: List[dict] = []
    firsts: List[Optional[dict]] = []
    for flavour, original, p in FLAVOURS:
        result = k3 if original == "keras3" else tk
        if not result:
            continue
        # (a) fit with SGD and Adam: at most the original's overhead and at
        # most the barrier plus a quarter of what the original adds to it.
        for opt in ("SGD", "Adam"):
            rows = merged_rows(k3, tk, "a", opt)
            needs = (p + "ours", original, p + "barrier", p + "plain")
            if not all(r in rows for r in needs):
                continue

            def bound_a(o, k, br, pl):
                k, br = k / pl - 1, br / pl - 1
                return min(k, br + (k - br) / 4)
            out.append(_target(
                f"(a) {flavour}, {opt}: ours <= original and <= barrier + "
                "(original - barrier) / 4", rows, needs,
                lambda o, k, br, pl: o / pl - 1, bound_a,
                lambda v, b, rows=rows, original=original, p=p:
                f"{_pct_est(v)} vs {_pct(b.value)} (original "
                f"{_pct_est(overhead(rows, original))}, barrier "
                f"{_pct_est(overhead(rows, p + 'barrier'))})"))
            firsts.append(_first_call_target(
                f"(a) {flavour}, {opt}: first call, ours <= original", rows,
                p + "ours", original))
            firsts.append(_first_call_target(
                f"(a) {flavour}, {opt}, every step skipped: first call, ours"
                " <= original", rows, p + "ours skipped",
                original + " skipped"))
        # (b) the 1500-variable loop, documented flow: at most half the
        # original's overhead. Keras 3's original has one flow.
        rows = merged_rows(k3, tk, "b")
        needs = (p + "ours documented", original, p + "plain")
        if all(r in rows for r in needs):
            variables = result.get("b", {}).get("variables", "?")
            out.append(_target(
                f"(b) {flavour}, {variables} variables, documented flow: "
                "ours <= original / 2", rows, needs,
                lambda o, k, pl: o / pl - 1, lambda o, k, pl: (k / pl - 1) / 2,
                lambda v, b, rows=rows, original=original:
                f"{_pct_est(v)} vs {_pct(b.value)} (original "
                f"{_pct_est(overhead(rows, original))})"))
        for ours, flow in (("ours", "Keras 3 flow"),
                           ("ours documented", "documented flow")):
            firsts.append(_first_call_target(
                f"(b) {flavour}, {flow}: first call, ours <= original", rows,
                p + ours, original))
        # (c) check+unscale through the public API, as extra ms over the
        # plain row (reading the gradients): big within 1.5 x one read,
        # small at most half the original's.
        c = result.get("c", {})
        big = merged_rows(k3, tk, "c", "big")
        needs = (p + "ours", p + "one read", p + "plain")
        if all(r in big for r in needs):
            out.append(_target(
                f"(c) {flavour}, {c['big']['tensors']} tensors / "
                f"{c['big']['floats'] / 1e6:.1f}M floats: ours <= 1.5 x one "
                "read", big, needs,
                lambda o, r, pl: (o - pl) / (r - pl),
                lambda o, r, pl: 1.5,
                lambda v, b, big=big, p=p:
                f"{_x_est(v)} one read ({_ms(extra_ms(big, p + 'ours'))} "
                f"vs {_ms(extra_ms(big, p + 'one read'))} ms)"))
        small = merged_rows(k3, tk, "c", "small")
        needs = (p + "ours", original, p + "plain")
        if all(r in small for r in needs):
            out.append(_target(
                f"(c) {flavour}, {c['small']['tensors']} tensors of 1000 "
                "floats: ours <= original / 2", small, needs,
                lambda o, k, pl: (o - pl) / (k - pl),
                lambda o, k, pl: 0.5,
                lambda v, b, small=small, p=p, original=original:
                f"{_x_est(v)} the original's cost "
                f"({_ms(extra_ms(small, p + 'ours'))} vs "
                f"{_ms(extra_ms(small, original))} ms)"))
        for case, rows in (("big", big), ("small", small)):
            firsts.append(_first_call_target(
                f"(c) {flavour}, {case}: first call, ours <= original", rows,
                p + "ours", original))
    return out + [t for t in firsts if t is not None]


def xla_targets(k3: Optional[dict], tk: Optional[dict]) -> List[dict]:
    """Issue 21's targets under XLA, each flavour against its own original.

    (e) SGD and Adam, and (f) each flow: ours at most three quarters of the
    original's overhead and at most limit + (original - limit) / 4; first
    calls no slower than the original's.
    """
    out: List[dict] = []
    firsts: List[Optional[dict]] = []

    def bound(o, k, lim, pl):
        k, lim = k / pl - 1, lim / pl - 1
        return min(0.75 * k, lim + (k - lim) / 4)

    for flavour, original, p in FLAVOURS:
        if not (k3 if original == "keras3" else tk):
            continue
        cases = [(f"(e) {flavour}, {opt}", merged_rows(k3, tk, "e", opt),
                  p + "ours") for opt in ("SGD", "Adam")]
        cases += [(f"(f) {flavour}, {flow}", merged_rows(k3, tk, "f"),
                   p + ours) for ours, flow in
                  (("ours", "Keras 3 flow"),
                   ("ours documented", "documented flow"))]
        for name, rows, ours in cases:
            needs = (ours, original, p + "limit", p + "plain")
            if not all(r in rows for r in needs):
                continue
            out.append(_target(
                f"{name}: ours <= 3/4 original and <= limit + (original - "
                "limit) / 4", rows, needs,
                lambda o, k, lim, pl: o / pl - 1, bound,
                lambda v, b, rows=rows, original=original, p=p:
                f"{_pct_est(v)} vs {_pct(b.value)} (original "
                f"{_pct_est(overhead(rows, original))}, limit "
                f"{_pct_est(overhead(rows, p + 'limit'))})"))
            firsts.append(_first_call_target(
                f"{name}: first call, ours <= original", rows, ours,
                original))
    return out + [t for t in firsts if t is not None]


def _verdict(t: dict) -> str:
    met = {True: "yes", False: "**no**", None: "n/a"}[t["met"]]
    return met + (" (within noise)" if t.get("noise") else "")


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
             f"{sizes.mlp_batch}, {' and '.join(sizes.optimizers)}, "
             f"{sizes.mlp_steps} interleaved steps",
        "b": f"tf.function GradientTape loop: {sizes.many_layers} x Dense("
             f"{sizes.many_width}, tanh), {b.get('variables', '?')} "
             f"variables, SGD, {sizes.many_steps} interleaved steps; Keras 3"
             " in both flows, tf_keras in the documented flow",
        "c": "check+unscale through the public API: big = "
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
        "step - 1, in the same process, with its 90% bootstrap interval "
        "(rounds resampled). * tf_keras rows ran in their own process and "
        "are compared with its plain tf_keras step and its own "
        "LossScaleOptimizer.",
    ]
    if any(w in (r or {}) for w in "abcd" for r in (k3, tk)):
        lines += non_xla_report(k3, tk, desc)
    lines += xla_report(k3, tk, mode)
    return "\n".join(lines) + "\n"


def non_xla_report(k3: Optional[dict], tk: Optional[dict],
                   desc: Dict[str, str]) -> List[str]:
    """The tables (a) to (d) that ran and issue 15's targets."""
    ran = {w for r in (k3, tk) for w in "abcd" if w in (r or {})}
    sections = {
        "a": [f"**(a)** {desc['a']}", "", *table_a(k3, tk),
              *[line for opt in ("SGD", "Adam")
                for line in warm_up_line(k3, tk, "a", opt)], ""],
        "b": [f"**(b)** {desc['b']}", "", *table_b(k3, tk),
              *warm_up_line(k3, tk, "b"), ""],
        "c": [f"**(c)** {desc['c']}. Extra ms over the plain row (reading "
              "the gradients and returning them); ** over reading the one "
              "tensor.", "", *table_c(k3, tk), ""],
        "d": [f"**(d)** {desc['d']}", "", *table_d(k3, tk), ""],
    }
    lines = [""] + [line for w in "abcd" if w in ran for line in sections[w]]
    lines += [
        "**Targets** (issue 15; each flavour against its own original, "
        "verdicts on the medians; \"within noise\": the 90% interval of "
        "measured - bound holds zero)", "",
        "| target | measured | met |", "|---|---|---|",
    ]
    for t in targets(k3, tk):
        lines.append(f"| {t['target']} | {t['measured']} | {_verdict(t)} |")
    return lines


def xla_report(k3: Optional[dict], tk: Optional[dict], mode: str
               ) -> List[str]:
    """The XLA tables (e), (f) and issue 21's targets, if they ran."""
    if not any("e" in (r or {}) or "f" in (r or {}) for r in (k3, tk)):
        return []
    sizes = common.MODES[mode]
    source = k3 or tk or {}
    e_vars = source.get("e", {}).get("SGD", {}).get("variables", "?")
    f_vars = source.get("f", {}).get("variables", "?")
    return [
        "", "#### Under XLA (`jit_compile=True`: Keras 3's default for "
        "`fit` on a GPU)", "",
        f"**(e)** (a) compiled whole: `compile(..., jit_compile=True)` + "
        f"train_on_batch, {sizes.mlp_layers} x Dense({sizes.mlp_width}), "
        f"{e_vars} variables, batch {sizes.mlp_batch}, "
        f"{sizes.xla_steps} interleaved steps. The limit row is the plain "
        "optimizer whose update also depends on one all-finite read of its "
        "gradients (never skipping).", "", *table_a(k3, tk, "e"),
        *[line for opt in ("SGD", "Adam")
          for line in warm_up_line(k3, tk, "e", opt)], "",
        f"**(f)** the (b) loop as `tf.function(jit_compile=True)`: "
        f"{sizes.xla_loop_layers} x Dense({sizes.many_width}, tanh), "
        f"{f_vars} variables, SGD, {sizes.xla_steps} interleaved steps", "",
        *table_b(k3, tk, "f"), *warm_up_line(k3, tk, "f"), "",
        "**Targets under XLA** (issue 21; each flavour against its own "
        "original)", "", "| target | measured | met |", "|---|---|---|",
        *[f"| {t['target']} | {t['measured']} | {_verdict(t)} |"
          for t in xla_targets(k3, tk)]]

def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="every row, smaller (b) and (c), fewer "
                        "steps: about 3 minutes on 2 cores")
    parser.add_argument("--json", metavar="PATH", default=None,
                        help="also write every number as JSON to PATH")
    parser.add_argument("--mode", choices=sorted(common.MODES), default=None,
                        help=argparse.SUPPRESS)
    parser.add_argument("--workloads", default="abcdef",
                        help="a subset of abcdef (default: all; e and f "
                        "are a and b compiled with XLA)")
    parser.add_argument("--xla", action="store_true",
                        help="only the XLA workloads (e, f): a few minutes")
    args = parser.parse_args(argv)
    if args.xla:
        args.workloads = "ef"
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
             "keras3": k3, "tf_keras": tk, "targets": targets(k3, tk),
             "xla_targets": xla_targets(k3, tk),
             "markdown": text}, indent=1))
    return 0 if k3 is not None and tk is not None else 1


if __name__ == "__main__":
    sys.exit(main())
