"""The loss-scaling arguments of a `LossScaleOptimizer`, checked once.

`check_settings` takes what a user passed (`dynamic`, `initial_scale`,
`dynamic_growth_steps` and the keyword-only knobs `min_scale`, `max_scale`,
`growth_factor`, `backoff_factor`, `hysteresis`), fills in the defaults of
`state_machine` and returns a frozen `Settings`; `Settings.rule()` is the
`state_machine.Rule` the step follows. Every flavour reads its arguments from
here, so an argument is checked, defaulted and serialized in one place.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional

import numpy as np

from tf_lossscale import _checks, state_machine

__all__ = [
    "KNOB_DEFAULTS", "SMALLEST_NORMAL_FLOAT32", "STOP_DEFAULTS", "Settings",
    "check_settings"]

# The least floor the rule applies: 2**-126, the smallest normal float32.
# TensorFlow flushes subnormal float32s to zero (on CPU and GPU), so a
# floor below it would let the scale reach 0, where it would stay (0 grows
# to 0). A smaller `min_scale` is accepted and kept in the config; the rule
# floors at this value instead, which is still >= `min_scale`.
SMALLEST_NORMAL_FLOAT32 = float(np.finfo(np.float32).tiny)

# Keyword-only knobs and their defaults; at these values the rule is
# TensorFlow's and no knob appears in a config.
KNOB_DEFAULTS: Dict[str, Any] = {
    "min_scale": 1.0,
    "max_scale": None,
    "growth_factor": state_machine.DEFAULT_MULTIPLIER,
    "backoff_factor": 1.0 / state_machine.DEFAULT_MULTIPLIER,
    "hysteresis": 1,
}

# Keyword-only knobs of the skip telemetry (stop a stuck run; save the
# counters in checkpoints), for a fixed scale too; at these defaults
# nothing stops, checkpoints hold the originals' keys only, and no knob
# appears in a config.
STOP_DEFAULTS: Dict[str, Any] = {
    "max_consecutive_skips": None,
    "save_telemetry": False,
}


@dataclasses.dataclass(frozen=True)
class Settings:
    """The checked loss-scaling arguments of one optimizer."""

    dynamic: bool
    initial_scale: float
    dynamic_growth_steps: Optional[int]
    min_scale: float = 1.0
    max_scale: Optional[float] = None
    growth_factor: float = state_machine.DEFAULT_MULTIPLIER
    backoff_factor: float = 1.0 / state_machine.DEFAULT_MULTIPLIER
    hysteresis: int = 1
    max_consecutive_skips: Optional[int] = None
    save_telemetry: bool = False

    def rule(self) -> state_machine.Rule:
        """The transition constants (dynamic settings only)."""
        return state_machine.Rule(
            period=self.dynamic_growth_steps or 1,
            growth_factor=self.growth_factor,
            backoff_factor=self.backoff_factor,
            min_scale=max(self.min_scale, SMALLEST_NORMAL_FLOAT32),
            max_scale=self.max_scale,
            hysteresis=self.hysteresis)

    def knobs(self) -> Dict[str, Any]:
        """The knobs that differ from their defaults (for `get_config`)."""
        return {name: getattr(self, name)
                for name, default in {**KNOB_DEFAULTS, **STOP_DEFAULTS}.items()
                if getattr(self, name) != default}


def _check_dynamic(dynamic: Any) -> None:
    if not isinstance(dynamic, bool):
        # tf_keras' sentence first (code and tests match it), then ours.
        raise TypeError(
            '"dynamic" argument to LossScaleOptimizer.__init__ must be a '
            f"bool, but got: {dynamic!r}. dynamic must be a bool (True for "
            f"dynamic loss scaling, False for a fixed scale); got {dynamic!r} "
            f"of type {type(dynamic).__name__}. To pass a legacy loss_scale "
            "such as 'dynamic' or 128, use tf_lossscale.experimental."
            "LossScaleOptimizer(optimizer, loss_scale).")


def _check_knobs(knobs: Dict[str, Any], initial_scale: float
                 ) -> Dict[str, Any]:
    """Checks the knobs of a dynamic scale; raises ValueError naming one."""
    checked = dict(KNOB_DEFAULTS)
    checked["min_scale"] = _checks.check_real(
        "min_scale", knobs["min_scale"], minimum=0.0, inclusive=False)
    if knobs["max_scale"] is not None:
        checked["max_scale"] = _checks.check_real(
            "max_scale", knobs["max_scale"], minimum=checked["min_scale"])
    checked["growth_factor"] = _checks.check_real(
        "growth_factor", knobs["growth_factor"], minimum=1.0,
        inclusive=False)
    checked["backoff_factor"] = _checks.check_real(
        "backoff_factor", knobs["backoff_factor"], minimum=0.0,
        inclusive=False, maximum=1.0)
    if np.float32(checked["backoff_factor"]) >= 1:
        raise ValueError(
            "backoff_factor must be a number in (0, 1); got "
            f"{knobs['backoff_factor']!r}, which is 1.0 as a float32 (its "
            "storage) and would never lower the scale.")
    checked["hysteresis"] = _checks.check_int(
        "hysteresis", knobs["hysteresis"], minimum=1)
    upper = checked["max_scale"]
    bounded = (checked["min_scale"] != KNOB_DEFAULTS["min_scale"]
               or upper is not None)
    # Without bounds, an initial scale below 1 is TensorFlow's to accept.
    if bounded and not checked["min_scale"] <= initial_scale <= (
            _checks.FLOAT32_MAX if upper is None else upper):
        raise ValueError(
            "initial_scale must lie between min_scale and max_scale; got "
            f"min_scale={checked['min_scale']!r}, initial_scale="
            f"{initial_scale!r}, max_scale={upper!r}.")
    if bounded and initial_scale < SMALLEST_NORMAL_FLOAT32:
        # A subnormal start reads as 0 in TensorFlow's arithmetic, and a
        # scale of 0 would grow to 0 on every finite step.
        raise ValueError(
            "initial_scale must be >= 2**-126 (the smallest normal float32; "
            "TensorFlow flushes smaller ones to 0) when min_scale is below "
            f"it; got initial_scale={initial_scale!r}, min_scale="
            f"{checked['min_scale']!r}.")
    return checked


def check_settings(dynamic: Any, initial_scale: Any,
                   dynamic_growth_steps: Any, **knobs: Any) -> Settings:
    """Checks the loss-scaling arguments and fills in the defaults.

    Dynamic scaling defaults to `initial_scale=2**15` (any finite number > 0,
    like `DynamicLossScale`) and `dynamic_growth_steps=2000` (an int >= 1).
    A fixed scale (`dynamic=False`) needs `initial_scale` (a number >= 1,
    like `FixedLossScale`) and takes no `dynamic_growth_steps` and no knob.

    Raises:
      TypeError: `dynamic` is not a bool, or an unknown knob is passed.
      ValueError: a number is missing, of the wrong type or out of range.
    """
    _check_dynamic(dynamic)
    unknown = sorted(set(knobs) - set(KNOB_DEFAULTS) - set(STOP_DEFAULTS))
    if unknown:
        raise TypeError(
            f"Unknown loss-scaling arguments {unknown}; the knobs are "
            f"{sorted({**KNOB_DEFAULTS, **STOP_DEFAULTS})}.")
    stops = _check_stops({k: knobs.pop(k) for k in STOP_DEFAULTS
                          if k in knobs})
    given = {**KNOB_DEFAULTS, **knobs}
    if not dynamic:
        return dataclasses.replace(_fixed_settings(
            initial_scale, dynamic_growth_steps, knobs), **stops)
    if initial_scale is None:
        initial_scale = state_machine.DEFAULT_INITIAL_SCALE
    if dynamic_growth_steps is None:
        dynamic_growth_steps = state_machine.DEFAULT_GROWTH_STEPS
    scale = _checks.check_real("initial_scale", initial_scale, minimum=0.0,
                               inclusive=False)
    steps = _checks.check_int("dynamic_growth_steps", dynamic_growth_steps,
                              minimum=1)
    return Settings(True, scale, steps, **_check_knobs(given, scale),
                    **stops)


def _check_stops(stops: Dict[str, Any]) -> Dict[str, Any]:
    """Checks the stop knobs; raises ValueError naming one."""
    checked = {**STOP_DEFAULTS, **stops}
    if checked["max_consecutive_skips"] is not None:
        checked["max_consecutive_skips"] = _checks.check_int(
            "max_consecutive_skips", checked["max_consecutive_skips"],
            minimum=1)
    if not isinstance(checked["save_telemetry"], bool):
        raise TypeError(
            "save_telemetry must be a bool (True saves skipped_steps and "
            "the run of skipped steps in checkpoints); got "
            f"{checked['save_telemetry']!r} of type "
            f"{type(checked['save_telemetry']).__name__}.")
    return checked


def _fixed_settings(initial_scale: Any, dynamic_growth_steps: Any,
                    knobs: Dict[str, Any]) -> Settings:
    if initial_scale is None:
        raise ValueError(
            '"initial_scale" must be specified if "dynamic" is False. '
            "initial_scale is required when dynamic=False (it is the fixed "
            "loss scale): pass a number >= 1; got None.")
    if dynamic_growth_steps is not None:
        raise ValueError(
            '"dynamic_growth_steps" must be None if "dynamic" is False, but '
            f"got: {dynamic_growth_steps}. dynamic_growth_steps must be None "
            "when dynamic=False (a fixed scale never grows); got "
            f"{dynamic_growth_steps!r}.")
    changed = sorted(k for k, v in knobs.items() if v != KNOB_DEFAULTS[k])
    if changed:
        given = ", ".join(f"{k}={knobs[k]!r}" for k in changed)
        raise ValueError(
            f"{given}: the knobs {changed} apply only to a dynamic loss "
            "scale, and dynamic=False. Pass dynamic=True, or drop them.")
    return Settings(False, _checks.check_real(
        "initial_scale", initial_scale, minimum=1.0), None)
