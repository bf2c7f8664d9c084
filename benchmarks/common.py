"""Sizes, timing and the pieces every workload shares (no TensorFlow import).

A worker process imports this after it has chosen its Keras (`keras` or
`tf_keras`), so nothing here imports TensorFlow at module level.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

# Every inner optimizer a row may wrap, in the tables' column order.
OPTIMIZERS = ("SGD", "Adam", "AdamW")


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How big and how long each workload runs in one mode."""

    mlp_layers: int          # (a) Dense(mlp_width) layers
    mlp_width: int
    mlp_batch: int
    mlp_steps: int
    optimizers: Sequence[str]  # (a) inner optimizers
    many_layers: int         # (b) Dense(many_width) layers: 2 variables each
    many_width: int
    many_steps: int
    big_tensors: int         # (c) this many (384, 1000) plus as many (1000,)
    small_tensors: int       # (c) this many (1000,)
    check_steps: int
    fusions: Sequence[int]   # (d) gradient counts for our kernel
    fusions_per_tensor: Sequence[int]  # (d) ... for per-tensor HLO (slow)
    xla_steps: int = 40      # (e) and (f): interleaved XLA steps
    xla_loop_layers: int = 100  # (f) Dense(many_width) layers under XLA
    transformer_blocks: int = 2  # (g) and (h): encoder blocks
    # (g) and (h): vocabulary, tokens per sequence, width
    transformer_shape: Tuple[int, int, int] = (512, 32, 64)
    # (g) and (h): first calls per scaler row (1: no fresh instance)
    transformer_first_calls: int = 3
    # (g) and (h): the inner optimizers (AdamW: what keras-hub's models
    # are trained with, issue 32)
    transformer_optimizers: Sequence[str] = OPTIMIZERS
    # (a), (b), (e), (f): how many rows, the first ones, get a warm-up twin
    # (None: every row) and the bootstrap's resamples per figure.
    twins: Optional[int] = None
    resamples: int = 1000
    # Added to the workers' XLA_FLAGS; whether to collect garbage before
    # timing each workload.
    xla_flags: str = ""
    collect_garbage: bool = True
    # Each scaler row's first call is timed on this many fresh instances
    # (its timed one and fresh twins of it, interleaved); the figure is
    # their median. One sample moves by a tenth between runs.
    first_calls: int = 3
    # The workloads this mode runs unless told otherwise.
    workloads: str = "abcdefgh"
    # (b) and (f): also time ours in Keras 3's flow (scale_loss +
    # apply_gradients), not only in the documented one.
    keras_flow: bool = True


MODES: Dict[str, Sizes] = {
    "full": Sizes(mlp_layers=40, mlp_width=512, mlp_batch=64, mlp_steps=80,
                  optimizers=("SGD", "Adam"), many_layers=750, many_width=16,
                  many_steps=60, big_tensors=86, small_tensors=2000,
                  check_steps=40, fusions=(10, 100, 1000),
                  fusions_per_tensor=(10, 100, 1000), xla_steps=60,
                  xla_loop_layers=250),
    # Every row and target of the full run (but AdamW's in (g) and (h)),
    # smaller and shorter: 200 variables in (b), 500 tensors in (c,
    # small), fewer steps.
    "quick": Sizes(mlp_layers=40, mlp_width=512, mlp_batch=64, mlp_steps=20,
                   optimizers=("SGD", "Adam"), many_layers=100, many_width=16,
                   many_steps=20, big_tensors=86, small_tensors=500,
                   check_steps=15, fusions=(10, 100, 1000),
                   fusions_per_tensor=(10, 100), xla_steps=20,
                   xla_loop_layers=50, transformer_optimizers=("SGD", "Adam")),
    # For users, in a few minutes: fit without and with XLA (a, e), SGD and
    # Adam, against Keras' own; one first call a row, and 40 rounds (a
    # step costs tens of ms: rounds are cheap, and 15 left intervals tens
    # of points wide).
    "short": Sizes(mlp_layers=40, mlp_width=512, mlp_batch=64, mlp_steps=40,
                   optimizers=("SGD", "Adam"), many_layers=750, many_width=16,
                   many_steps=10, big_tensors=86, small_tensors=0,
                   check_steps=10, fusions=(), fusions_per_tensor=(),
                   xla_steps=40, first_calls=1, workloads="ae",
                   keras_flow=False),
    # What a change to the step must not make worse: (a) and (e), the
    # documented custom-loop flow at 1500 variables (b; building and
    # tracing it is most of the run, so only the rows its target needs)
    # and the big check+unscale (c; no small case), with the targets those
    # rows carry (`targets.short_targets`). Its time goes to rounds, which
    # narrow the per-step intervals (15 rounds left most verdicts "within
    # noise"), not to first calls: one each (the medians of three are
    # `quick`'s).
    "targets": Sizes(mlp_layers=40, mlp_width=512, mlp_batch=64,
                     mlp_steps=40, optimizers=("SGD", "Adam"),
                     many_layers=750, many_width=16, many_steps=30,
                     big_tensors=86, small_tensors=0, check_steps=30,
                     fusions=(), fusions_per_tensor=(), xla_steps=40,
                     first_calls=1, workloads="abce", keras_flow=False),
    # Only proves that the harness runs (the test suite's smoke test): every
    # row, table and target, at the least cost. Most of it is tracing and
    # XLA compiles, one per row and one per twin: one layer, one twin per
    # workload (the code path runs; the row first in the table gets it),
    # XLA's LLVM back end unoptimised (the optimized HLO, which (d) counts,
    # is the same; compiling takes about a fifth less CPU), no collection.
    "tiny": Sizes(mlp_layers=1, mlp_width=32, mlp_batch=8, mlp_steps=3,
                  optimizers=("SGD",), many_layers=1, many_width=8,
                  many_steps=3, big_tensors=2, small_tensors=20,
                  check_steps=3, fusions=(10,), fusions_per_tensor=(10,),
                  xla_steps=3, xla_loop_layers=1, twins=1, resamples=100,
                  xla_flags="--xla_backend_optimization_level=0",
                  collect_garbage=False, first_calls=2,
                  transformer_blocks=1, transformer_shape=(16, 4, 8),
                  transformer_first_calls=1,
                  transformer_optimizers=("AdamW",)),
}

WARMUP_CALLS = 2


@dataclasses.dataclass
class Timing:
    """One row: its first calls' seconds and per-call seconds."""

    first_calls: List[float]
    samples: List[float] = dataclasses.field(default_factory=list)

    @property
    def first_call_s(self) -> float:
        return _median(self.first_calls)

    def median_ms(self) -> float:
        return 1e3 * _median(self.samples)

    def as_json(self) -> dict:
        return {"first_call_s": round(self.first_call_s, 3),
                "first_calls_s": [round(s, 3) for s in self.first_calls],
                "median_ms": round(self.median_ms(), 3),
                "samples_ms": [round(1e3 * s, 3) for s in self.samples]}


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2


def as_in_a_new_process() -> None:
    """Forgets what tf_lossscale traced once per gradient signature.

    Its XLA verdict is a `tf.function` that a later step with the same
    gradient shapes reuses (`finite_xla`): a row's first call would reuse
    the trace of an earlier row or instance, as no first call in a new
    process can.
    """
    # The benchmark's own reach into a private name: tf.function has no
    # public way to drop its traces, and the library keeps no hook for it.
    import tensorflow as tf

    from tf_lossscale import finite_xla
    finite_xla._checked = tf.function(  # type: ignore[attr-defined]
        finite_xla._checked.python_function, autograph=False)


def time_first_call(fn: Callable[[], object]) -> float:
    """Seconds for the first call (trace, compile, run), paying whatever
    tf_lossscale traces once per process (`as_in_a_new_process`)."""
    as_in_a_new_process()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


Fresh = Dict[str, Callable[[], Callable[[], object]]]


def again(fresh: Fresh, rounds: int,
          log: Optional[Callable[[str], None]] = None
          ) -> Dict[str, List[float]]:
    """More first calls: `rounds` rounds, each builds a fresh instance of
    every row in `fresh` (row -> a factory of its runner) and times its
    first call, starting one row later each round; the instance is then
    dropped."""
    names = list(fresh)
    seconds: Dict[str, List[float]] = {name: [] for name in names}
    for round_ in range(rounds):
        shift = (round_ + 1) % max(len(names), 1)
        for name in names[shift:] + names[:shift]:
            runner = fresh[name]()
            seconds[name].append(time_first_call(runner))
            del runner
            if log is not None:
                log(f"  first call of {name} (fresh, {round_ + 2}): "
                    f"{seconds[name][-1]:.2f} s")
    return seconds


def interleave(rows: Dict[str, Callable[[], object]], steps: int,
               log: Optional[Callable[[str], None]] = None,
               collect: bool = True, fresh: Optional[Fresh] = None,
               first_calls: int = 1) -> Dict[str, Timing]:
    """Times `rows` round-robin, first calls included, medians compared.

    Every row is called once per round, starting each round one row later,
    so slow drift and a row's position in the round hit all rows alike.
    The garbage collector is collected and frozen before timing: after heavy
    tracing it can pause a step for up to a second (`collect=False` skips
    the collection, a quarter of a second or more each time, where the
    timings do not matter). `log`, if given, gets a line per first call
    (the long ones are most of a run's time). The rows of `fresh` (row ->
    a factory of a fresh instance's runner) get `first_calls - 1` more
    first calls (`again`), before the rows' own are timed.
    """
    more = again(fresh or {}, first_calls - 1, log)
    timings = {}
    for name, fn in rows.items():
        timings[name] = Timing([time_first_call(fn)] + more.get(name, []))
        if log is not None:
            log(f"  first call of {name}: {timings[name].first_calls[0]:.2f}"
                " s")
    names = list(rows)
    for _ in range(WARMUP_CALLS):
        for name in names:
            rows[name]()
    if collect:
        gc.collect()
    gc.freeze()
    try:
        for step in range(steps):
            shift = step % len(names)
            for name in names[shift:] + names[:shift]:
                start = time.perf_counter()
                rows[name]()
                timings[name].samples.append(time.perf_counter() - start)
    finally:
        gc.unfreeze()
    return timings


def paired_over(timings: Dict[str, Timing], base: str = "plain"
                ) -> Dict[str, float]:
    """Each row's median over `base`: the median, over rounds, of its step
    divided by `base`'s step of the same round, minus 1 (`interleave`
    appends one sample per row per round, so the i-th samples pair up)."""
    ref = timings[base].samples
    return {name: _median([a / b for a, b in zip(t.samples, ref)]) - 1
            for name, t in timings.items()}


def print_over(timings: Dict[str, Timing], base: str = "plain",
               unit: str = "ms") -> None:
    """A line per row: its median step (in ms, or "us") and its paired
    median over `base` (`paired_over`), the stand-alone scripts' table."""
    over = paired_over(timings, base)
    width = max(len(row) for row in timings)
    for row, timing in timings.items():
        step = (f"{timing.median_ms() * 1e3:7.0f} us" if unit == "us"
                else f"{timing.median_ms():7.2f} ms")
        print(f"  {row:{width}s} {step}  {100 * over[row]:+5.1f}% over "
              f"{base}")


def print_fit_steps(models: Dict[str, Any], x: Any, y: Any, steps: int,
                    header: str, unit: str = "ms") -> None:
    """The stand-alone scripts' run: each row's compiled model takes
    `train_on_batch(x, y)` round-robin (`interleave`), then `header` and
    each row over the "plain" one (`print_over`)."""
    runners = {row: (lambda m=model: m.train_on_batch(x, y))
               for row, model in models.items()}
    timings = interleave(runners, steps)
    print(header)
    print_over(timings, unit=unit)


def optimizer_error(keras: Any, name: str) -> Optional[str]:
    """Why `name` is not a class of `keras.optimizers`, or None if it is."""
    if isinstance(getattr(keras.optimizers, name, None), type):
        return None
    return (f"--optimizer {name!r} is not a class of keras.optimizers (SGD, "
            "Adam, AdamW, ...)")


def warm_up(rows: Dict[str, Callable[[], object]]) -> Dict[str, float]:
    """Calls each row's one-layer twin once; its seconds per row.

    The first trace that reaches a library's code in a process pays once
    for what later traces reuse (AutoGraph converting that code, lazy
    imports): about 2 s for tf_lossscale's, whichever row comes first. The
    twins pay it, so each row's first call is its own model's trace, graph
    optimisation and first step.
    """
    return {name: round(time_first_call(fn), 3)
            for name, fn in rows.items()}


_START = time.perf_counter()


def log(message: str) -> None:
    """A progress line on stderr: this process's Keras, seconds so far."""
    keras = ("tf_keras" if os.environ.get("TF_USE_LEGACY_KERAS") == "1"
             else "keras3")
    print(f"[{keras} {time.perf_counter() - _START:5.0f} s] {message}",
          file=sys.stderr, flush=True)


def load_average() -> List[float]:
    """The 1, 5 and 15 minute load averages (empty where unknown)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []
