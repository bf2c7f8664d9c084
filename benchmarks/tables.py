"""The Markdown tables of the report, one per workload, and the targets'.

`table_a` serves (a) and (e) (fit, SGD and Adam side by side), `table_b`
(b) and (f) (the custom loop), `table_c` the check+unscale timings,
`table_d` the XLA fusion counts. Rows appear in `LABELS` order, the Keras 3
process's first, then tf_keras' (`*`).
"""

from __future__ import annotations

from typing import Dict, List, Optional

import common
from estimates import (
    BASES,
    FLAVOURS,
    Rows,
    base_of,
    extra_ms,
    median_ms,
    merged_rows,
    ms,
    node,
    overhead,
    pct_est,
)

# Row key (after merging) -> label, in table order. Per-workload overrides
# below name what the (b) and (c) rows run.
LABELS = {
    "plain": "Keras 3: plain optimizer",
    "barrier": "Keras 3: plain + barrier (limit)",
    "limit": "Keras 3: plain + one all-finite read (limit)",
    "keras3": "Keras 3: its LossScaleOptimizer",
    "ours": "Keras 3: tf_lossscale",
    "ours documented": "Keras 3: tf_lossscale, documented flow",
    "ours, no record": "Keras 3: tf_lossscale without the skip record",
    "keras3 skipped": "Keras 3: its LossScaleOptimizer, every step skipped",
    "ours skipped": "Keras 3: tf_lossscale, every step skipped",
    "one read": "Keras 3 process: one read of all gradients (limit)",
    "one tensor": "Keras 3 process: one read, one concatenated tensor "
                  "(limit) †",
    "tf_keras:plain": "tf_keras: plain optimizer *",
    "tf_keras:barrier": "tf_keras: plain + barrier (limit) *",
    "tf_keras:limit": "tf_keras: plain + one all-finite read (limit) *",
    "tf_keras": "tf_keras: its LossScaleOptimizer *",
    "tf_keras:ours": "tf_keras: tf_lossscale *",
    "tf_keras:ours documented": "tf_keras: tf_lossscale, documented flow *",
    "tf_keras:ours, no record": "tf_keras: tf_lossscale without the skip "
                                "record *",
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
    "ours, no record": "Keras 3: tf_lossscale without the skip record, "
                       "Keras 3 flow",
    "tf_keras:ours, no record": "tf_keras: tf_lossscale without the skip "
                                "record, documented flow *",
}
LABELS_C = {
    "keras3": "Keras 3: `check_finite` + a divide per tensor",
    "ours": "Keras 3: tf_lossscale `get_unscaled_gradients` + its verdict",
    "tf_keras": "tf_keras: `get_unscaled_gradients` + `_is_all_finite` *",
    "tf_keras:ours": "tf_keras: tf_lossscale `get_unscaled_gradients` + "
                     "its verdict *",
}


def _first(rows: Rows, row: str) -> str:
    return f"{rows[row]['first_call_s']:.2f}" if row in rows else "n/a"


def _ordered(rows: Rows) -> List[str]:
    return [k for k in LABELS if k in rows]


def _label(row: str, overrides: Optional[Dict[str, str]] = None) -> str:
    return (overrides or {}).get(row, LABELS[row])


def table_a(k3: Optional[dict], tk: Optional[dict], workload: str = "a"
            ) -> List[str]:
    per_opt = [(opt, merged_rows(k3, tk, workload, opt))
               for opt in common.OPTIMIZERS]
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
                cells += [ms(median_ms(rows, row)),
                          "" if row in BASES
                          else pct_est(overhead(rows, row)),
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
        ovh = "" if row in BASES else pct_est(overhead(rows, row))
        lines.append(f"| {_label(row, LABELS_B)} | {ms(median_ms(rows, row))}"
                     f" | {ovh} | {_first(rows, row)} |")
    return lines


def warm_up_line(k3: Optional[dict], tk: Optional[dict], *path: str
                 ) -> List[str]:
    """The one-layer twins' first calls: the one-off costs of a process."""
    parts = []
    for (flavour, _, _), result in zip(FLAVOURS, (k3, tk)):
        warm = node(result, *path).get("warm_up_s")
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
    base = "plain one tensor" if row == "one tensor" else base_of(row)
    return extra_ms(rows, row, base)


def table_c(k3: Optional[dict], tk: Optional[dict]) -> List[str]:
    cases = [(case, merged_rows(k3, tk, "c", case))
             for case in ("big", "small")]
    cases = [(case, rows) for case, rows in cases if rows]
    lines = ["| row | " + " | ".join(
        f"{case}: ms | {case}: + ms over plain | {case}: first call s"
        for case, _ in cases) + " |",
        "|---|" + "---:|---:|---:|" * len(cases)]
    merged: dict = {}
    for _, rows in cases:
        merged.update(rows)
    for row in _ordered(merged):
        cells = []
        for _, rows in cases:
            extra = "" if row in BASES else ms(_c_extra(rows, row))
            cells += [ms(median_ms(rows, row)), extra, _first(rows, row)]
        lines.append(f"| {_label(row, LABELS_C)} | " + " | ".join(cells)
                     + " |")
    return lines


def table_d(k3: Optional[dict], tk: Optional[dict]) -> List[str]:
    d3 = (k3 or {}).get("d", {}).get("per gradient count", {})
    dk = (tk or {}).get("d", {}).get("per gradient count", {})
    same = (k3 or {}).get("d", {}).get("same bytes", {})
    names = [("ours", "tf_lossscale kernel (jit_compile=True)", d3),
             ("same", "tf_lossscale kernel, `10**6` floats in n gradients",
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


def targets_table(found: List[dict]) -> List[str]:
    """The targets as a table: name, what was measured, the verdict."""
    return ["| target | measured | met |", "|---|---|---|",
            *[f"| {t['target']} | {t['measured']} | {_verdict(t)} |"
              for t in found]]


def _verdict(t: dict) -> str:
    met = {True: "yes", False: "**no**", None: "n/a"}[t["met"]]
    return met + (" (within noise)" if t.get("noise") else "")
