"""Every rule that turns the legacy `loss_scale=` spelling into the current one.

TF <= 2.3's experimental `LossScaleOptimizer(opt, loss_scale)` took one
argument; the current optimizer takes `dynamic`, `initial_scale` and
`dynamic_growth_steps`. This module is the single table between the two: the
experimental optimizer, `LossScaleOptimizer.from_config`, the migration shim
and the source rewriter all call it. (The table of legacy *names* is
`tf_lossscale.compat.legacy_names`.)

=======================================  =====================================
legacy `loss_scale`                      current arguments
=======================================  =====================================
"dynamic"                                dynamic=True (2**15, 2000)
an int or float `v`                      dynamic=False, initial_scale=v
`FixedLossScale(v)`                      dynamic=False, initial_scale=v
`DynamicLossScale(s, p, 2.0)`            dynamic=True, initial_scale=s,
                                         dynamic_growth_steps=p
`DynamicLossScale(..., multiplier!=2)`   ValueError (no current equivalent)
`{"class_name": ..., "config": ...}`     as the class it names
=======================================  =====================================

TensorFlow's own `tf.compat.v1.mixed_precision.FixedLossScale` and
`DynamicLossScale` convert as this package's classes do. An optimizer config
of TF <= 2.3 (`{"optimizer": ..., "loss_scale": ...}`) or of an older Keras 3
(base-optimizer keys at their defaults) is upgraded by
`upgrade_optimizer_config`; `to_legacy_loss_scale` goes the other way.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

import tensorflow as tf

from tf_lossscale import _checks, state_machine
from tf_lossscale import loss_scale as loss_scale_lib

__all__ = [
    "DYNAMIC_LOSS_SCALE_RENAMES",
    "KERAS_BASE_OPTIMIZER_DEFAULTS",
    "dynamic_args",
    "fixed_args",
    "from_dynamic_loss_scale_args",
    "from_legacy_loss_scale",
    "to_legacy_loss_scale",
    "upgrade_optimizer_config",
]


# DynamicLossScale argument -> LossScaleOptimizer argument.
DYNAMIC_LOSS_SCALE_RENAMES = {
    "initial_loss_scale": "initial_scale",
    "increment_period": "dynamic_growth_steps",
}

# Keys that Keras 3's LossScaleOptimizer configs held before Keras dropped
# them, with the only values it accepts back (anything else belongs on the
# inner optimizer).
KERAS_BASE_OPTIMIZER_DEFAULTS = {
    "weight_decay": None,
    "clipnorm": None,
    "global_clipnorm": None,
    "clipvalue": None,
    "use_ema": False,
    "ema_momentum": 0.99,
    "ema_overwrite_frequency": None,
    "loss_scale_factor": None,
    "gradient_accumulation_steps": None,
}

OptimizerArgs = Dict[str, Any]


def dynamic_args(initial_scale: float = state_machine.DEFAULT_INITIAL_SCALE,
                 dynamic_growth_steps: int = state_machine.DEFAULT_GROWTH_STEPS
                 ) -> OptimizerArgs:
    """Optimizer arguments for dynamic scaling (values checked by the caller)."""
    return {"dynamic": True, "initial_scale": float(initial_scale),
            "dynamic_growth_steps": int(dynamic_growth_steps)}


def fixed_args(value: Any) -> OptimizerArgs:
    """Optimizer arguments for a fixed scale `value` (a number >= 1)."""
    value = _checks.check_real("loss_scale", value, minimum=1.0)
    return {"dynamic": False, "initial_scale": value,
            "dynamic_growth_steps": None}


def from_dynamic_loss_scale_args(
    initial_loss_scale: float = state_machine.DEFAULT_INITIAL_SCALE,
    increment_period: int = state_machine.DEFAULT_GROWTH_STEPS,
    multiplier: float = 2.0,
    *,
    passed: Optional[str] = None,
) -> OptimizerArgs:
    """Optimizer arguments equal to a `DynamicLossScale(...)` with these args.

    `passed` is how the error shows the loss scale given to the experimental
    constructor (its repr); None means it came from a config.

    Raises:
      ValueError: `multiplier` is not 2, which the optimizer cannot express.
    """
    if multiplier != 2:
        raise ValueError(_multiplier_message(
            passed, initial_loss_scale, increment_period, multiplier))
    return dynamic_args(initial_loss_scale, increment_period)


def _multiplier_message(passed: Optional[str], initial_loss_scale: Any,
                        increment_period: Any, multiplier: Any) -> str:
    """TF 2.4's wording (its tests match it), then what is accepted."""
    if passed is None:  # From a config: shown as TF's graph-mode repr.
        shown = (f"DynamicLossScale(initial_loss_scale={initial_loss_scale!r}"
                 f", increment_period={increment_period!r}, "
                 f"multiplier={multiplier!r})")
        lead = ("Cannot deserialize LossScaleOptimizer with a "
                "DynamicLossScale whose multiplier is not 2. Got "
                f"DynamicLossScale: {shown}.")
    else:
        lead = ('When passing a DynamicLossScale to "loss_scale", '
                f"DynamicLossScale.multiplier must be 2. Got: {passed}.")
    return (f"{lead} The optimizer's dynamic loss scaling always multiplies "
            f"by 2; a DynamicLossScale with multiplier={multiplier!r} has no "
            "equivalent. Use multiplier=2.0 (the default).")


def from_legacy_loss_scale(loss_scale: Any) -> OptimizerArgs:
    """Converts a legacy `loss_scale` value to optimizer arguments.

    Args:
      loss_scale: "dynamic", an int or float >= 1, a `FixedLossScale`, a
        `DynamicLossScale` with multiplier 2, or a serialized one of those.

    Returns:
      A dict with the keys `dynamic`, `initial_scale`,
      `dynamic_growth_steps`.

    Raises:
      TypeError: a `LossScale` of any other class (as TF 2.4).
      ValueError: any other value.
    """
    if isinstance(loss_scale, str) and loss_scale == "dynamic":
        return dynamic_args()
    if _checks.is_real(loss_scale):
        return fixed_args(loss_scale)
    v1 = tf.compat.v1.mixed_precision  # TensorFlow's own classes, too.
    if isinstance(loss_scale, (loss_scale_lib.FixedLossScale,
                               v1.FixedLossScale)):
        return fixed_args(loss_scale.get_config()["loss_scale_value"])
    if isinstance(loss_scale, (loss_scale_lib.DynamicLossScale,
                               v1.DynamicLossScale)):
        return from_dynamic_loss_scale_args(**loss_scale.get_config(),
                                            passed=repr(loss_scale))
    if isinstance(loss_scale, Mapping):
        return _from_serialized(loss_scale)
    if isinstance(loss_scale, (loss_scale_lib.LossScale, v1.LossScale)):
        raise TypeError(
            "Passing a LossScale that is not a FixedLossScale or a "
            f"DynamicLossScale is no longer supported. Got: {loss_scale!r} "
            f"of type {type(loss_scale).__name__}, which no optimizer "
            "setting expresses. loss_scale must be 'dynamic', a number, a "
            "FixedLossScale or a DynamicLossScale.")
    raise ValueError(
        "loss_scale must be 'dynamic', an int or float >= 1, a "
        "FixedLossScale, a DynamicLossScale with multiplier 2, or a "
        f"serialized one of those; got {loss_scale!r} of type "
        f"{type(loss_scale).__name__}.")


def _from_serialized(config: Mapping[str, Any]) -> OptimizerArgs:
    """Converts `{"class_name": ..., "config": {...}}` without making variables."""
    name = config.get("class_name")
    inner = config.get("config")
    if not isinstance(inner, Mapping) or name not in (
            "FixedLossScale", "DynamicLossScale"):
        raise ValueError(
            "A serialized loss scale must be {'class_name': 'FixedLossScale' "
            "or 'DynamicLossScale', 'config': {...}}; got "
            f"{dict(config)!r}.")
    try:
        if name == "FixedLossScale":
            return fixed_args(inner["loss_scale_value"])
        return from_dynamic_loss_scale_args(**inner)
    except (KeyError, TypeError) as e:
        raise ValueError(
            f"The serialized {name} config {dict(inner)!r} is malformed: "
            f"{e!r}.") from None


def upgrade_optimizer_config(config: Mapping[str, Any]) -> Dict[str, Any]:
    """Returns a current optimizer config for one of any supported vintage.

    Accepts the current keys (`dynamic`, `initial_scale`,
    `dynamic_growth_steps`), Keras 3's (no `dynamic`: it is always dynamic;
    older versions also held base-optimizer keys at their defaults, which
    are dropped) and TF <= 2.3's (`loss_scale`, and `optimizer` for
    `inner_optimizer`). The `inner_optimizer` entry, and any other, is
    passed through untouched.

    Raises:
      ValueError: `loss_scale` is given together with the current keys, or
        is not convertible; `optimizer` together with `inner_optimizer`; a
        base-optimizer key away from its default.
    """
    config = dict(config)
    _drop_keras_base_defaults(config)
    if "optimizer" in config:
        if "inner_optimizer" in config:
            raise ValueError(
                "An optimizer config holds both the legacy 'optimizer' entry "
                "and the current 'inner_optimizer'; it must hold one "
                f"spelling only. Got {config!r}.")
        config["inner_optimizer"] = config.pop("optimizer")
    if "loss_scale" in config:
        clash = {"dynamic", "initial_scale",
                 "dynamic_growth_steps"} & set(config)
        if clash:
            raise ValueError(
                "An optimizer config holds the legacy 'loss_scale' entry "
                f"and the current {sorted(clash)}; it must hold one "
                f"spelling only. Got {config!r}.")
        config.update(from_legacy_loss_scale(config.pop("loss_scale")))
    config.setdefault("dynamic", True)
    return config


def _drop_keras_base_defaults(config: Dict[str, Any]) -> None:
    """Removes older Keras 3 base-optimizer keys that hold their defaults."""
    for key, default in KERAS_BASE_OPTIMIZER_DEFAULTS.items():
        if key not in config:
            continue
        value = config.pop(key)
        if value != default or type(value) is not type(default):
            raise ValueError(
                f"A LossScaleOptimizer config holds {key}={value!r}; only "
                f"{key}={default!r} is accepted there. Set {key} on the "
                "inner optimizer's config instead.")


def to_legacy_loss_scale(dynamic: bool, initial_scale: float,
                         dynamic_growth_steps: Optional[int]) -> Any:
    """The legacy `loss_scale` value for the current arguments.

    A number for a fixed scale, a serialized `DynamicLossScale` (multiplier
    2) otherwise: `from_legacy_loss_scale` turns it back into the same
    arguments, and no variable is created on the way.
    """
    if not dynamic:
        return initial_scale
    return {"class_name": "DynamicLossScale",
            "config": {"initial_loss_scale": initial_scale,
                       "increment_period": dynamic_growth_steps,
                       "multiplier": 2.0}}
