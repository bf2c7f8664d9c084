"""The report: the Markdown text `run.py` prints, from both workers' JSON.

A heading with the versions, the machine and its load; then, for the
workloads that ran, a description and table each and issue 15's targets,
then the XLA tables and issue 21's targets; (g) and (h), the transformer
with Dropout, with issue 32's targets. The tables are made in
`tables.py`, the targets in `targets.py`.
"""

from __future__ import annotations

import os
import platform
from typing import Dict, List, Optional

import common
from tables import (
    table_a,
    table_b,
    table_c,
    table_d,
    targets_table,
    warm_up_line,
)
from targets import short_targets, targets, xla_targets

_VERDICTS = ("verdicts on the medians; \"within noise\": the 90% interval of "
             "measured - bound holds zero, or for a first call (the median "
             "of its row's fresh instances) the two rows' first calls "
             "overlap")


def _describe(k3: Optional[dict], tk: Optional[dict], mode: str) -> dict:
    source = k3 or tk or {}
    a = source.get("a", {}).get("SGD", {})
    b = source.get("b", {})
    c = source.get("c", {})
    g = next(iter((source.get("g") or source.get("h") or {}).values()), {})
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
             f"{c.get('big', {}).get('floats', '?')} floats"
             + (f", small = {c['small'].get('tensors', '?')} tensors of "
                "1000 floats" if "small" in c else "")
             + f"; {sizes.check_steps} interleaved calls",
        "d": "XLA fusions (all kernels in brackets) in the optimized HLO "
             "of check+unscale over n float32 gradients of 1000 elements",
        "g": "compile + train_on_batch of a transformer with Dropout: "
             f"{g.get('model', '?')}, {g.get('parameters', '?')} parameters"
             f" in {g.get('variables', '?')} variables, "
             f"{', '.join(sizes.transformer_optimizers)}, "
             f"{sizes.xla_steps} interleaved steps",
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
    if mode in ("short", "targets"):
        return "\n".join(lines + short_report(k3, tk, desc)) + "\n"
    if any(w in (r or {}) for w in "abcdg" for r in (k3, tk)):
        lines += non_xla_report(k3, tk, desc)
    lines += xla_report(k3, tk, mode, desc)
    return "\n".join(lines) + "\n"


def short_report(k3: Optional[dict], tk: Optional[dict],
                 desc: Dict[str, str]) -> List[str]:
    """The short preset: the tables of (a), (e), (b) and (c) that ran, then
    its one list of targets (`short_targets`)."""
    ran = {w for r in (k3, tk) for w in "abce" if w in (r or {})}
    sections = {
        "a": [f"**(a)** {desc['a']}", "", *table_a(k3, tk), ""],
        "e": ["**(e)** (a) compiled whole by XLA (`jit_compile=True`, Keras "
              "3's default for `fit` on a GPU); the limit row is the plain "
              "optimizer whose update waits for one all-finite read", "",
              *table_a(k3, tk, "e"), ""],
        "b": [f"**(b)** {desc['b']}", "", *table_b(k3, tk), ""],
        "c": [f"**(c)** {desc['c']}. Extra ms over the plain row (reading "
              "the gradients and returning them).", "", *table_c(k3, tk),
              ""],
    }
    lines = [""] + [line for w in "aebc" if w in ran for line in sections[w]]
    return lines + ["**Targets** (each flavour against its own original; "
                    f"{_VERDICTS})", "",
                    *targets_table(short_targets(k3, tk))]


def non_xla_report(k3: Optional[dict], tk: Optional[dict],
                   desc: Dict[str, str]) -> List[str]:
    """The tables (a) to (d) and (g) that ran, issue 15's targets and
    issue 32's for (g)."""
    ran = {w for r in (k3, tk) for w in "abcdg" if w in (r or {})}
    sections = {
        "a": [f"**(a)** {desc['a']}", "", *table_a(k3, tk),
              *[line for opt in ("SGD", "Adam")
                for line in warm_up_line(k3, tk, "a", opt)], ""],
        "b": [f"**(b)** {desc['b']}", "", *table_b(k3, tk),
              *warm_up_line(k3, tk, "b"), ""],
        "c": [f"**(c)** {desc['c']}. Extra ms over the plain row (reading "
              "the gradients and returning them); † over reading the one "
              "tensor.", "", *table_c(k3, tk), ""],
        "d": [f"**(d)** {desc['d']}", "", *table_d(k3, tk), ""],
        "g": [f"**(g)** {desc['g']}", "", *table_a(k3, tk, "g"), ""],
    }
    lines = [""] + [line for w in "abcdg" if w in ran
                    for line in sections[w]]
    lines += [
        "**Targets** (issue 15; each flavour against its own original, "
        f"{_VERDICTS})", "",
    ]
    return lines + targets_table(targets(k3, tk))


def xla_report(k3: Optional[dict], tk: Optional[dict], mode: str,
               desc: Dict[str, str]) -> List[str]:
    """The XLA tables (e), (f), (h) and issue 21's targets (and issue 32's
    for (h)), if they ran."""
    if not any(w in (r or {}) for w in "efh" for r in (k3, tk)):
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
        *([f"**(h)** (g) compiled whole by XLA: {desc['g']}", "",
           *table_a(k3, tk, "h"), ""]
          if any("h" in (r or {}) for r in (k3, tk)) else []),
        "**Targets under XLA** (issue 21; each flavour against its own "
        f"original, {_VERDICTS})", "", *targets_table(xla_targets(k3, tk))]
