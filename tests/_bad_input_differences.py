"""The differential bad-input fuzz's verdicts, and its one table of differences.

Each case of the fuzz (`tests/test_differential_bad_input.py` for loss
scales, the Keras 3 flavour and the TF1 optimizer;
`tests/tf_keras_cases/cases_differential_bad_input.py` for tf_keras) runs
one call on ours and on its original and hands both outcomes to `judge`.
A case passes when the results are equal, when both raise the same
exception type (ours may raise a subclass: several of our exception types
are two at once, e.g. `ReplicaContextError(RuntimeError, ValueError)`), or
when `DELIBERATE` lists the difference, with its reason. Anything else
fails, naming the case and both outcomes.

`DELIBERATE` is the one list of the differences the fuzz may meet; each
entry says which pair and call it covers, how to recognise the case and
why the difference is kept (docs/differences.md and README's list).
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

__all__ = ["DELIBERATE", "USED", "Outcome", "Tally", "judge", "outcome",
           "plain", "used_rows"]


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one call did: its (normalised) result, or the exception type."""

    result: Any = None
    error: Optional[type] = None
    message: str = ""

    @property
    def raised(self) -> bool:
        return self.error is not None

    def __str__(self) -> str:
        if self.raised:
            return f"raised {self.error.__name__}: {self.message[:160]}"
        return f"returned {self.result!r}"


def plain(value: Any) -> Any:
    """A comparable Python form of a result (tensors as (dtype, values))."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if hasattr(value, "get_config") and hasattr(value, "update"):
        return (type(value).__name__, plain(value.get_config()))
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    if hasattr(value, "numpy") and hasattr(value, "dtype"):
        return plain_array(value.numpy(), str(getattr(value.dtype, "name",
                                                      value.dtype)))
    if isinstance(value, (np.ndarray, np.generic)):
        return plain_array(value, str(value.dtype))
    if isinstance(value, (int, float)):
        return float(value)
    return repr(value)


def plain_array(array: Any, dtype: str) -> Tuple[str, Any]:
    values = np.asarray(array, dtype=np.float64 if np.asarray(
        array).dtype.kind == "f" else None).tolist()
    return (dtype, values)


def outcome(call: Callable[[], Any],
            normalise: Callable[[Any], Any] = plain) -> Outcome:
    """Runs `call`; its result normalised, or the type it raised."""
    try:
        return Outcome(normalise(call()))
    except Exception as e:  # noqa: BLE001 - every type is the observation
        return Outcome(error=type(e), message=str(e))


def _equal(a: Any, b: Any) -> bool:
    """Equality in which NaN equals NaN (at any depth)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return a == b


# One row per deliberate difference: (pair, call, recognises the case,
# reason). `recognises` gets the case's arguments (a dict), our outcome
# and the original's; the first row that recognises a case explains it.
Recogniser = Callable[[Dict[str, Any], Outcome, Outcome], bool]


@dataclasses.dataclass(frozen=True)
class Difference:
    pair: str
    call: str
    recognises: Recogniser
    reason: str


def _raised(ours: Outcome, theirs: Outcome, mine: type,
            original: Optional[type] = None) -> bool:
    return (ours.raised and issubclass(ours.error, mine)
            and (original is None or (theirs.raised and issubclass(
                theirs.error, original))))


def _is_bool(x: Any) -> bool:
    return isinstance(x, (bool, np.bool_))


def _is_tensor_like(x: Any) -> bool:
    return hasattr(x, "numpy") and hasattr(x, "dtype") or isinstance(
        x, np.ndarray)


def _number(x: Any) -> Optional[float]:
    """The float of a Python/NumPy number or a scalar tensor/array, or None."""
    if _is_bool(x):
        return None
    try:
        if _is_tensor_like(x):
            array = np.asarray(x.numpy() if hasattr(x, "numpy") else x)
            if array.shape != () or array.dtype.kind not in "iuf":
                return None
            return float(array)
        if isinstance(x, (int, float, np.integer, np.floating)):
            return float(x)
    except Exception:  # noqa: BLE001 - not a number then
        return None
    return None


def _nonsense(x: Any, minimum: float, strict: bool = False) -> bool:
    """A bool, a non-finite number, one below `minimum` (also once rounded
    to float32: 1e-50 is 0 there, 1 + 1e-9 is 1), or beyond float32."""
    number = _number(x)
    if _is_bool(x):
        return True
    if number is None:
        return False
    if not math.isfinite(number) or abs(number) > float(
            np.finfo(np.float32).max):
        return True
    stored = float(np.float32(number))  # As a float32 variable holds it.
    return (number < minimum or stored < minimum
            or (strict and (number <= minimum or stored <= minimum)))


def _fractional(x: Any) -> bool:
    number = _number(x)
    return number is not None and math.isfinite(number) and (
        not float(number).is_integer())


def _not_a_number(x: Any) -> bool:
    """Neither None (the default) nor a bool nor a number (a string, a
    list, an array of another shape)."""
    return x is not None and not _is_bool(x) and _number(x) is None


def _skipped_alike(ours: Dict[str, Any], theirs: Dict[str, Any]) -> bool:
    """Equal states, but for `iterations`, which advanced by one in ours."""
    rest = [k for k in ours if k != "iterations"]
    (_, mine), (_, original) = ours["iterations"], theirs["iterations"]
    return _equal({k: ours[k] for k in rest},
                  {k: theirs.get(k) for k in rest}) and mine == original + 1


def _float32_scale_only(ours: Dict[str, Any], theirs: Dict[str, Any]) -> bool:
    """Equal Keras 3 constructions but for the scale's dtype, float32 in
    ours."""
    (mine, value), (original, their_value) = ours["scale"], theirs["scale"]
    rest = [k for k in ours if k != "scale"]
    return mine == "float32" and original != mine and value == their_value \
        and _equal({k: ours[k] for k in rest}, {k: theirs.get(k) for k in rest})


def _bad_period(x: Any) -> bool:
    """A step count that is nonsense: < 1, fractional, or no int64."""
    number = _number(x)
    return _nonsense(x, 1) or _fractional(x) or (
        number is not None and number >= 2.0**63)


def _k3_initial(case: Dict[str, Any]) -> Any:
    """The initial scale of a Keras 3 construction case (a number second
    is Keras 3's initial_scale)."""
    if "initial_scale" in case:
        return case["initial_scale"]
    second = case.get("positional", 1.0)
    return 1.0 if _is_bool(second) else second


def _any_arg(case: Dict[str, Any], test: Callable[[Any], bool]) -> bool:
    return any(test(v) for v in case.values())


DELIBERATE: List[Difference] = [
    # ---- loss scales: ours vs tf.compat.v1.mixed_precision ----
    Difference(
        "loss_scale", "DynamicLossScale",
        lambda c, o, t: _raised(o, t, ValueError) and (
            _nonsense(c.get("initial_loss_scale", 1.0), 0.0, strict=True)
            or _bad_period(c.get("increment_period", 1))
            or _nonsense(c.get("multiplier", 2.0), 1.0, strict=True)),
        "Nonsense numbers are refused with a ValueError naming the argument "
        "(a bool, a scale <= 0 or non-finite or beyond float32, a period < 1 "
        "or fractional, a multiplier <= 1), where TensorFlow takes a bool "
        "as 1, truncates a period and builds a scale that never works, or "
        "fails with another type (OverflowError for an inf period)."),
    Difference(
        "loss_scale", "DynamicLossScale",
        lambda c, o, t: _raised(o, t, ValueError) and (
            not t.raised or issubclass(t.error, TypeError)) and _any_arg(
            c, _not_a_number),
        "A string or a non-scalar array or tensor is refused with a "
        "ValueError (a number is expected), where TensorFlow raises "
        "TypeError from inside; TensorFlow 2.16 reads a numeric string and "
        "(with NumPy 1) a one-element array as the number."),
    Difference(
        "loss_scale", "FixedLossScale",
        lambda c, o, t: _raised(o, t, ValueError) and not t.raised and (
            _nonsense(c["loss_scale_value"], 1.0)),
        "A bool or a non-finite or float32-overflowing value is refused, "
        "where TensorFlow takes True as 1 and builds an inf scale."),
    Difference(
        "loss_scale", "FixedLossScale",
        lambda c, o, t: not o.raised and t.raised and isinstance(
            c["loss_scale_value"], (np.integer, np.floating)),
        "NumPy numbers are numbers: FixedLossScale(np.float32(8)) works "
        "(TensorFlow accepts only Python int and float)."),
    Difference(
        "loss_scale", "get",
        lambda c, o, t: not o.raised and t.raised and isinstance(
            c["identifier"], (np.integer, np.floating)),
        "NumPy numbers are numbers: get(np.float32(8)) is a FixedLossScale "
        "(TensorFlow's get accepts only Python int and float)."),
    Difference(
        "loss_scale", "get",
        lambda c, o, t: _raised(o, t, ValueError) and (
            _nonsense(c["identifier"], 1.0)) and not t.raised,
        "get(True) and get(inf) are refused (TensorFlow takes True as a "
        "FixedLossScale(1) and builds an inf scale)."),
    Difference(
        "loss_scale", "get",
        lambda c, o, t: _raised(o, t, ValueError, TypeError) and (
            _is_tensor_like(c["identifier"])),
        "A tensor identifier is refused with the documented ValueError "
        "(TensorFlow's get compares it with 'dynamic' and fails with a "
        "TypeError from inside)."),
    Difference(
        "loss_scale", "get",
        lambda c, o, t: not o.raised and t.raised and c.get("side_object"),
        "get() returns any LossScale as it is, ours included (TensorFlow's "
        "get refuses a tf_lossscale object, which is not its class)."),
    Difference(
        "loss_scale", "update",
        lambda c, o, t: not o.raised and t.raised and any(
            "tf.constant([1, 2])" in g for g in c["grads"]),
        "An integer gradient is finite by definition and counts as finite "
        "(TensorFlow's IsFinite has no integer kernel and raises)."),
    # ---- Keras 3 flavour: ours vs keras.mixed_precision.LossScaleOptimizer
    Difference(
        "keras3", "construct",
        lambda c, o, t: _raised(o, t, ValueError) and not t.raised and (
            _nonsense(_k3_initial(c), 0.0, strict=True)
            or _bad_period(c.get("dynamic_growth_steps", 1))
            or _not_a_number(_k3_initial(c))
            or _not_a_number(c.get("dynamic_growth_steps"))),
        "Nonsense numbers are refused with a ValueError naming the argument "
        "(a scale <= 0, non-finite, beyond float32, a string, a list or an "
        "array; a growth period < 1 or fractional); Keras 3 stores them and "
        "fails later or trains with them."),
    Difference(
        "keras3", "construct",
        lambda c, o, t: not o.raised and not t.raised and _float32_scale_only(
            o.result, t.result),
        "The scale variable is float32 whatever type initial_scale has "
        "(Keras 3.12 makes a float64 one from a float64 NumPy array)."),
    Difference(
        "keras3", "construct",
        lambda c, o, t: not o.raised and any(
            c.get(k, 0) is None for k in ("initial_scale",
                                          "dynamic_growth_steps")),
        "None means the default (TensorFlow's documented signature, "
        "initial_scale=None, dynamic_growth_steps=None); Keras 3 tries to "
        "make a tensor of None, or stores None as the growth period."),
    Difference(
        "keras3", "construct",
        lambda c, o, t: not o.raised and t.raised and c.get("dynamic") is
        False,
        "dynamic=False (a fixed scale, TensorFlow's documented API) works; "
        "Keras 3 refuses it."),
    Difference(
        "keras3", "construct",
        lambda c, o, t: _is_bool(c.get("positional")),
        "A bool second argument is TensorFlow's `dynamic` (its documented "
        "signature), so initial_scale may follow as a keyword; Keras 3 "
        "reads the second argument as initial_scale (a number second is "
        "read as Keras 3 reads it)."),
    Difference(
        "keras3", "construct",
        lambda c, o, t: _raised(o, t, TypeError) and (
            "dynamic" in c and not isinstance(c["dynamic"], bool)),
        "dynamic must be a bool (TensorFlow's documented signature), a "
        "TypeError as in TensorFlow and tf_keras; Keras 3 pops it, reads "
        "any truthy value as True and refuses a falsy one (ValueError)."),
    Difference(
        "keras3", "step",
        lambda c, o, t: c.get("nonfinite") and not o.raised
        and not t.raised and _skipped_alike(o.result, t.result),
        "A step with a NaN/Inf gradient changes no variable and no slot "
        "and advances `iterations` (Keras 3 does not advance it); the "
        "scale never falls below 1 (Keras 3 has no floor)."),
    Difference(
        "keras3", "step",
        lambda c, o, t: o.raised and o.error.__name__ == "GradientShapeError"
        and not t.raised,
        "A gradient must have its variable's shape; Keras 3 broadcasts a "
        "smaller one into the update (a (2,) gradient updates every row of "
        "a (2, 2) variable), which hides a wrong gradient."),
    Difference(
        "keras3", "step",
        lambda c, o, t: _raised(o, t, TypeError) and any(
            "tf.constant([1, 2])" in g for g in c["grads"]) and (
            not t.raised or "InvalidArgument" in t.error.__name__),
        "An integer gradient is refused with a TypeError (the unscale "
        "would truncate it, and no float loss has one); Keras 3 casts it "
        "and applies it (or first fails on another gradient of the step)."),
    # ---- TF1 optimizer: ours vs tf.compat.v1.mixed_precision ----
    Difference(
        "v1", "construct",
        lambda c, o, t: _raised(o, t, ValueError) and not t.raised and (
            _nonsense(c["loss_scale"], 1.0)),
        "A bool, non-finite or float32-overflowing loss_scale is refused "
        "(TensorFlow takes True as 1 and builds an inf scale)."),
    Difference(
        "v1", "construct",
        lambda c, o, t: not o.raised and t.raised and isinstance(
            c["loss_scale"], (np.integer, np.floating)),
        "NumPy numbers are numbers (TensorFlow's get accepts only Python "
        "int and float)."),
    Difference(
        "v1", "construct",
        lambda c, o, t: _raised(o, t, ValueError, TypeError) and (
            _is_tensor_like(c["loss_scale"])),
        "A tensor loss_scale is refused with the documented ValueError "
        "(TensorFlow's get compares it with 'dynamic' and fails with a "
        "TypeError from inside)."),
    Difference(
        "v1", "step",
        lambda c, o, t: c.get("nonfinite") and c.get("fixed")
        and not o.raised and not t.raised,
        "A step with a NaN/Inf gradient changes no variable with a fixed "
        "scale too (TensorFlow applies it when the scale is fixed)."),
    # ---- tf_keras flavour: ours vs tf_keras.mixed_precision ----
    Difference(
        "tf_keras", "construct",
        lambda c, o, t: _raised(o, t, ValueError) and not t.raised and (
            _nonsense(c.get("initial_scale", 1.0), 0.0, strict=True)
            or _bad_period(c.get("dynamic_growth_steps", 1))),
        "Nonsense numbers are refused with a ValueError naming the argument "
        "(a bool, a scale <= 0 or non-finite or beyond float32, a period "
        "< 1 or fractional); tf_keras stores them and fails later."),
    Difference(
        "tf_keras", "get_scaled_loss",
        lambda c, o, t: not o.raised and t.raised and c["loss"] == "4.0",
        "get_scaled_loss takes a Python number as a loss (converted to a "
        "tensor, as TensorFlow's ops take it); tf_keras reads its `.dtype` "
        "and raises AttributeError."),
    Difference(
        "tf_keras", "step",
        lambda c, o, t: c.get("nonfinite") and c.get("fixed")
        and not o.raised and not t.raised,
        "A step with a NaN/Inf gradient changes no variable with a fixed "
        "scale too (tf_keras applies it when the scale is fixed)."),
]


# Indices of the rows that explained a case in this process.
USED: collections.Counter = collections.Counter()


def explain(pair: str, call: str, case: Dict[str, Any], ours: Outcome,
            theirs: Outcome) -> Optional[str]:
    """The reason of the first listed difference that covers the case."""
    for index, row in enumerate(DELIBERATE):
        if row.pair == pair and row.call == call:
            try:
                if row.recognises(case, ours, theirs):
                    USED[index] += 1
                    return row.reason
            except Exception:  # noqa: BLE001 - a row that does not apply
                continue
    return None


class Tally:
    """Counts of a pair's cases by verdict (equal, same type, deliberate)."""

    def __init__(self) -> None:
        self.counts: collections.Counter = collections.Counter()
        self.reasons: collections.Counter = collections.Counter()

    def line(self, pair: str, seconds: float) -> str:
        c = self.counts
        return (f"{pair}: {sum(c.values())} cases: {c['equal']} equal, "
                f"{c['same_type']} same exception type, {c['deliberate']} "
                f"deliberate; {seconds:.1f} s")


def judge(tally: Tally, pair: str, call: str, case: Dict[str, Any],
          ours: Outcome, theirs: Outcome) -> str:
    """Classifies one case; raises AssertionError for an unlisted difference."""
    if not ours.raised and not theirs.raised and _equal(ours.result,
                                                        theirs.result):
        verdict = "equal"
    elif ours.raised and theirs.raised and issubclass(ours.error,
                                                      theirs.error):
        verdict = "same_type"
    else:
        reason = explain(pair, call, case, ours, theirs)
        if reason is None:
            raise AssertionError(
                f"{pair} {call} {case!r}: ours {ours}; original {theirs}. "
                "Not equal, not the same exception type, and not in "
                "DELIBERATE.")
        tally.reasons[reason[:60]] += 1
        verdict = "deliberate"
    tally.counts[verdict] += 1
    return verdict


def used_rows(pairs: List[str]) -> str:
    """Per row of `pairs`, how many cases it explained in this process."""
    return "\n".join(
        f"  row {i} ({row.pair} {row.call}): {USED[i]} cases: "
        f"{row.reason[:70]}" for i, row in enumerate(DELIBERATE)
        if row.pair in pairs)
