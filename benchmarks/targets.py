"""The targets: each flavour against its own original, from the same run.

`targets` holds issue 15's (the default path: (a) fit, (b) the custom
loop, (c) check+unscale; first calls), `xla_targets` issue 21's (under XLA:
(e) fit, (f) the custom loop); each also issue 32's for the transformer
with Dropout ((g) without XLA, (h) with: `dropout_targets`). A target is `value <= bound`, both computed
from the medians of the rows it needs; the verdict is on the medians, and
`noise` says whether the interval of value - bound holds zero (for a first
call, the median of its fresh instances' first calls: whether the two
rows' first calls overlap).
benchmarks/README.md states each target and why.
"""

from __future__ import annotations

from typing import Callable, Iterator, List, Optional, Sequence, Tuple

import common
from estimates import (
    FLAVOURS,
    Estimate,
    Rows,
    extra_ms,
    measure,
    merged_rows,
    ms,
    overhead,
    pct,
    pct_est,
    x_est,
)


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
    own = rows[ours].get("first_calls_s", [mine])
    other = rows[original].get("first_calls_s", [theirs])
    shown = f"{mine:.3g} s vs {theirs:.3g} s"
    if len(own) > 1 and len(other) > 1:
        shown += f" (medians of {len(own)} and {len(other)})"
    return {"target": name, "measured": shown,
            "value": mine, "bound": theirs, "met": mine <= theirs,
            "noise": _overlap(own, other)}


def _overlap(own: Sequence[float], other: Sequence[float]
             ) -> Optional[bool]:
    """Whether two rows' first calls overlap (None: one sample of either):
    then another run may give the other verdict."""
    if len(own) < 2 or len(other) < 2:
        return None
    return min(own) <= max(other) and min(other) <= max(own)


def _fit_rows(k3: Optional[dict], tk: Optional[dict], original: str,
              p: str) -> Iterator[Tuple[str, Rows, Sequence[str]]]:
    """(a)'s rows per optimizer that has every row its targets need (ours,
    the original, the barrier, plain), and those rows' names."""
    needs = (p + "ours", original, p + "barrier", p + "plain")
    for opt in ("SGD", "Adam"):
        rows = merged_rows(k3, tk, "a", opt)
        if all(r in rows for r in needs):
            yield opt, rows, needs


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
        for opt, rows, needs in _fit_rows(k3, tk, original, p):

            def bound_a(o, k, br, pl):
                k, br = k / pl - 1, br / pl - 1
                return min(k, br + (k - br) / 4)
            out.append(_target(
                f"(a) {flavour}, {opt}: ours <= original and <= barrier + "
                "(original - barrier) / 4", rows, needs,
                lambda o, k, br, pl: o / pl - 1, bound_a,
                lambda v, b, rows=rows, original=original, p=p:
                f"{pct_est(v)} vs {pct(b.value)} (original "
                f"{pct_est(overhead(rows, original))}, barrier "
                f"{pct_est(overhead(rows, p + 'barrier'))})"))
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
                f"{pct_est(v)} vs {pct(b.value)} (original "
                f"{pct_est(overhead(rows, original))})"))
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
                f"{x_est(v)} one read ({ms(extra_ms(big, p + 'ours'))} "
                f"vs {ms(extra_ms(big, p + 'one read'))} ms)"))
        small = merged_rows(k3, tk, "c", "small")
        needs = (p + "ours", original, p + "plain")
        if all(r in small for r in needs):
            out.append(_target(
                f"(c) {flavour}, {c['small']['tensors']} tensors of 1000 "
                "floats: ours <= original / 2", small, needs,
                lambda o, k, pl: (o - pl) / (k - pl),
                lambda o, k, pl: 0.5,
                lambda v, b, small=small, p=p, original=original:
                f"{x_est(v)} the original's cost "
                f"({ms(extra_ms(small, p + 'ours'))} vs "
                f"{ms(extra_ms(small, original))} ms)"))
        for case, rows in (("big", big), ("small", small)):
            firsts.append(_first_call_target(
                f"(c) {flavour}, {case}: first call, ours <= original", rows,
                p + "ours", original))
    return (out + [t for t in firsts if t is not None]
            + dropout_targets(k3, tk, "g"))


def dropout_targets(k3: Optional[dict], tk: Optional[dict], workload: str
                    ) -> List[dict]:
    """Issue 32's: in the transformer with Dropout, (g) without XLA and (h)
    with, ours at most the original's overhead; first calls too."""
    out: List[dict] = []
    firsts: List[Optional[dict]] = []
    for flavour, original, p in FLAVOURS:
        for opt in common.OPTIMIZERS:
            rows = merged_rows(k3, tk, workload, opt)
            needs = (p + "ours", original, p + "plain")
            if not all(r in rows for r in needs):
                continue
            name = f"({workload}) {flavour}, {opt}"
            out.append(_target(
                f"{name}: ours <= original", rows, needs,
                lambda o, k, pl: o / pl - 1, lambda o, k, pl: k / pl - 1,
                lambda v, b: f"{pct_est(v)} vs {pct(b.value)}"))
            firsts.append(_first_call_target(
                f"{name}: first call, ours <= original", rows, p + "ours",
                original))
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
                f"{pct_est(v)} vs {pct(b.value)} (original "
                f"{pct_est(overhead(rows, original))}, limit "
                f"{pct_est(overhead(rows, p + 'limit'))})"))
            firsts.append(_first_call_target(
                f"{name}: first call, ours <= original", rows, ours,
                original))
    return (out + [t for t in firsts if t is not None]
            + dropout_targets(k3, tk, "h"))


def short_targets(k3: Optional[dict], tk: Optional[dict]) -> List[dict]:
    """The short preset's targets (issue 32's), each flavour against its
    own original: what a change to the step is checked against.

    (a) fit without XLA: ours <= original, and <= barrier + 3 points; (b)
    the documented flow: ours <= original / 2; (c) big: ours <= 2 x one
    read (a read and a write); first calls of (a), (b), (c) no slower than
    the original's; and under XLA, (e)'s targets from `xla_targets`.
    """
    out: List[dict] = []
    for flavour, original, p in FLAVOURS:
        for opt, rows, needs in _fit_rows(k3, tk, original, p):
            name = f"(a) {flavour}, {opt}"
            out.append(_target(
                f"{name}: ours <= original", rows, needs,
                lambda o, k, br, pl: o / pl - 1,
                lambda o, k, br, pl: k / pl - 1,
                lambda v, b: f"{pct_est(v)} vs {pct(b.value)}"))
            out.append(_target(
                f"{name}: ours <= barrier + 3 points", rows, needs,
                lambda o, k, br, pl: o / pl - 1,
                lambda o, k, br, pl: br / pl - 1 + 0.03,
                lambda v, b: f"{pct_est(v)} vs {pct(b.value)}"))
        big = merged_rows(k3, tk, "c", "big")
        needs = (p + "ours", p + "one read", p + "plain")
        if all(r in big for r in needs):
            out.append(_target(
                f"(c) {flavour}, big: ours <= 2 x one read", big, needs,
                lambda o, r, pl: (o - pl) / (r - pl),
                lambda o, r, pl: 2.0,
                lambda v, b, big=big, p=p:
                f"{x_est(v)} one read ({ms(extra_ms(big, p + 'ours'))} "
                f"vs {ms(extra_ms(big, p + 'one read'))} ms)"))
    out += [t for t in targets(k3, tk) if _in_short(t["target"])]
    return out + [t for t in xla_targets(k3, tk)
                  if t["target"].startswith("(e)")]


def _in_short(name: str) -> bool:
    """Whether one of issue 15's targets is also the short preset's: (b)'s
    half of the original, and the first calls of (a), (b) and (c) big."""
    if name.startswith("(b)"):
        return "ours <= original / 2" in name or "first call" in name
    if name.startswith("(c)"):
        return "first call" in name and ", big:" in name
    return name.startswith("(a)") and "first call" in name
