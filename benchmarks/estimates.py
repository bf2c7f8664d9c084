"""The figures of the report: medians, overheads, their bootstrap intervals.

A worker's JSON holds, per workload, rows (row key -> first call and
samples); `merged_rows` puts the rows of both processes side by side (the
tf_keras ones prefixed), and every figure the tables and targets show is
computed here from the medians, with a 90% interval from resampled rounds.
No TensorFlow import.
"""

from __future__ import annotations

import random
import statistics
from typing import Callable, Dict, NamedTuple, Optional, Sequence

# The flavours: the Keras of each worker process, the key of its original
# (its own LossScaleOptimizer) and the prefix its rows get in a merged
# table (each is compared with the plain step of its own process).
FLAVOURS = (("Keras 3", "keras3", ""), ("tf_keras", "tf_keras", "tf_keras:"))

BOOTSTRAP_RESAMPLES = 1000
INTERVAL = 0.90

Rows = Dict[str, dict]  # row key -> a worker's row (first_call_s, samples_ms)

# The plain rows every other row of its process is compared with.
BASES = ("plain", "tf_keras:plain")


class Estimate(NamedTuple):
    """A figure from medians, with its bootstrap interval."""

    value: float
    low: float
    high: float


def node(result: Optional[dict], *path: str) -> dict:
    """`result[path[0]][path[1]]...`, or {} where a key is missing."""
    found = result
    for key in path:
        found = None if found is None else found.get(key)
    return found or {}


def merged_rows(k3: Optional[dict], tk: Optional[dict], *path: str) -> Rows:
    """Rows of one workload from both processes; tf_keras' rows prefixed.

    tf_keras rows keep their own `plain` under `tf_keras:plain`, so each is
    compared with the plain step of its own process.
    """
    rows: Rows = {}
    for result, prefix in ((k3, ""), (tk, "tf_keras:")):
        for name, row in (node(result, *path).get("rows") or {}).items():
            key = name if prefix == "" or name.startswith("tf_keras") \
                else prefix + name
            rows[key] = row
    return rows


def base_of(row: str) -> str:
    """The plain row of the process `row` comes from."""
    return "tf_keras:plain" if row.startswith("tf_keras") else "plain"


def median_ms(rows: Rows, row: str) -> Optional[float]:
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


def use_resamples(n: int) -> None:
    """Sets the bootstrap's resamples per figure (the mode's)."""
    global BOOTSTRAP_RESAMPLES
    BOOTSTRAP_RESAMPLES = n


def _ratio_minus_one(row: float, base: float) -> float:
    return row / base - 1


def overhead(rows: Rows, row: str, base: Optional[str] = None
             ) -> Optional[Estimate]:
    """Median step / median base step - 1 (base: plain of its process)."""
    return measure(rows, (row, base or base_of(row)), _ratio_minus_one)


def extra_ms(rows: Rows, row: str, base: Optional[str] = None
             ) -> Optional[float]:
    """Median ms of `row` over its base's (base: plain of its process)."""
    value, ref = median_ms(rows, row), median_ms(rows, base or base_of(row))
    if value is None or ref is None:
        return None
    return value - ref


# --- how a figure is written -------------------------------------------------

def pct(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}%"


def pct_est(e: Optional[Estimate]) -> str:
    if e is None:
        return "n/a"
    return (f"{pct(e.value)} [{100 * e.low:+.1f}, {100 * e.high:+.1f}]")


def x_est(e: Optional[Estimate]) -> str:
    if e is None:
        return "n/a"
    return f"{e.value:.2f}x [{e.low:.2f}, {e.high:.2f}]"


def ms(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:.2f}"
