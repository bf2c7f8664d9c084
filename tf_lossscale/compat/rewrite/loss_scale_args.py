"""A legacy `loss_scale` argument, in source, as optimizer arguments.

TF 2.1-2.3 spelt the loss scale as one argument (`"dynamic"`, a number, a
`FixedLossScale(...)` or a `DynamicLossScale(...)`); the current optimizer
takes `dynamic`, `initial_scale` and `dynamic_growth_steps`. The rules are
`tf_lossscale.config_conversion`'s, applied here to literals in source:
that module imports TensorFlow, which the rewriter must not, so the few
checks it needs are restated below, and `tests/test_migrate.py` pins them to
`config_conversion` value by value.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Dict, List, Optional, Sequence

import libcst as cst

from tf_lossscale.compat import legacy_names as table
from tf_lossscale.compat.rewrite.syntax import (
    Unconvertible,
    bind,
    code,
    kwarg,
    literal,
)

__all__ = ["BY_HAND", "check_fixed", "check_multiplier", "legacy_kind",
           "optimizer_args"]

NameOf = Callable[[cst.CSTNode], Optional[str]]

FLOAT32_MAX = 3.4028234663852886e38
BY_HAND = ("pass dynamic=, initial_scale= and dynamic_growth_steps= to "
           "tf_lossscale.LossScaleOptimizer by hand")
# Arguments of the loss-scale constructors, in order, and the optimizer
# argument each one becomes (config_conversion.DYNAMIC_LOSS_SCALE_RENAMES).
_FIXED_PARAMS = ("loss_scale_value",)
_DYNAMIC_PARAMS = ("initial_loss_scale", "increment_period", "multiplier")
_OPTIMIZER_ARG_OF = {"loss_scale_value": "initial_scale",
                     "initial_loss_scale": "initial_scale",
                     "increment_period": "dynamic_growth_steps"}


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_fixed(value: Any) -> None:
    """Raises `ValueError` unless `value` is a fixed loss scale (>= 1).

    As `config_conversion.fixed_args`: a finite int or float from 1 to the
    float32 maximum, bools rejected.
    """
    accepted = (f"a finite int or float >= 1 and <= {FLOAT32_MAX!r} (the "
                "float32 maximum)")
    if not _is_real(value):
        raise ValueError(f"loss_scale must be {accepted}; got {value!r} of "
                         f"type {type(value).__name__}.")
    if not math.isfinite(value) or not 1 <= value <= FLOAT32_MAX:
        raise ValueError(f"loss_scale must be {accepted}; got {value!r}.")


def check_multiplier(value: Any) -> None:
    """Raises `ValueError` unless `value` is 2, the optimizer's multiplier."""
    if value != 2:
        raise ValueError(
            "The optimizer's dynamic loss scaling always multiplies by 2; a "
            f"DynamicLossScale with multiplier={value!r} has no equivalent. "
            "Use multiplier=2.0 (the default).")


def legacy_kind(value: Any) -> str:
    """"dynamic" or "fixed" for a literal legacy `loss_scale`.

    Raises:
      ValueError: `value` is neither "dynamic" nor a number >= 1.
    """
    if isinstance(value, str) and value == "dynamic":
        return "dynamic"
    if _is_real(value):
        check_fixed(value)
        return "fixed"
    raise ValueError(
        "loss_scale must be 'dynamic', an int or float >= 1, a "
        "FixedLossScale, a DynamicLossScale with multiplier 2, or a "
        f"serialized one of those; got {value!r} of type "
        f"{type(value).__name__}.")


def optimizer_args(original: cst.BaseExpression,
                   updated: cst.BaseExpression,
                   name_of: NameOf) -> List[cst.Arg]:
    """The optimizer arguments equal to the legacy `loss_scale` expression.

    Args:
      original: the expression as parsed (its names resolve in `name_of`).
      updated: the same expression with legacy names already rewritten.
      name_of: the qualified name a node refers to, if imported.

    Raises:
      Unconvertible: the expression is not a literal or a loss-scale
        constructor call, or its values have no current equivalent.
    """
    if isinstance(original, cst.Call) and isinstance(updated, cst.Call):
        constructor = _constructor(name_of(original.func))
        if constructor is not None:
            return _constructor_args(original, updated, constructor)
    try:
        value = literal(original)
    except Unconvertible as e:
        raise Unconvertible(
            f"loss_scale={code(original)}: {e}, so the rewriter cannot tell "
            f"its kind; {BY_HAND}") from None
    try:
        kind = legacy_kind(value)
    except ValueError as e:
        raise Unconvertible(str(e)) from None
    if kind == "dynamic":
        return []  # The current defaults.
    return [kwarg("dynamic", cst.Name("False")),
            kwarg("initial_scale", updated)]


def _constructor(name: Optional[str]) -> Optional[str]:
    """"FixedLossScale" or "DynamicLossScale" if `name` is such a class."""
    entry = table.LEGACY_NAMES.get(name or "")
    current = entry.current if entry else name
    for cls in ("FixedLossScale", "DynamicLossScale"):
        if current == f"tf_lossscale.{cls}":
            return cls
    return None


def _constructor_args(original: cst.Call, updated: cst.Call,
                      constructor: str) -> List[cst.Arg]:
    """Optimizer arguments for a `FixedLossScale`/`DynamicLossScale` call.

    Literal values are checked; others are passed on under their new names
    and checked by the optimizer at run time, except the multiplier, which
    must be a literal 2.
    """
    dynamic = constructor == "DynamicLossScale"
    params: Sequence[str] = _DYNAMIC_PARAMS if dynamic else _FIXED_PARAMS
    what = code(original.func)
    bound = bind(original.args, params, what)
    literals: Dict[str, Any] = {}
    for param, i in bound.items():
        try:
            literals[param] = literal(original.args[i].value)
        except Unconvertible:
            if param == "multiplier":
                raise Unconvertible(
                    f"{what}: multiplier={code(original.args[i].value)} is "
                    "not a literal 2, the only multiplier the optimizer has; "
                    f"{BY_HAND}") from None
    try:
        if "multiplier" in literals:
            check_multiplier(literals["multiplier"])
        if "loss_scale_value" in literals:
            check_fixed(literals["loss_scale_value"])
    except ValueError as e:
        raise Unconvertible(str(e)) from None
    if not dynamic and "loss_scale_value" not in bound:
        raise Unconvertible(f"{what} is called without its loss scale")
    args = [] if dynamic else [kwarg("dynamic", cst.Name("False"))]
    for param, i in bound.items():
        if param in _OPTIMIZER_ARG_OF:
            args.append(kwarg(_OPTIMIZER_ARG_OF[param],
                              updated.args[i].value))
    return args
