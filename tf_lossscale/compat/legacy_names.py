"""The table of legacy names: what TF 2.1-2.15 code wrote, and what it becomes.

Each legacy spelling (`tensorflow` for `tf`) maps to the object the migration
shim binds it to and the name the rewriter writes instead; both read this
table, and nothing else in the package names a legacy spelling.
"""

from __future__ import annotations

from typing import Dict, NamedTuple, Optional

__all__ = [
    "LEGACY_NAMES",
    "LegacyName",
    "VANISHED_MODULES",
    "default_policy_loss_scale",
]

# The legacy names: what users of TF 2.1-2.4 wrote (`tensorflow` for `tf`),
# what the migration shim `tf_lossscale.compat` binds each to, and what the
# rewriter `tf_lossscale.compat.migrate` writes instead. Both read this table.


class LegacyName(NamedTuple):
    shim: str  # The object the shim binds the legacy name to.
    current: str  # The name the rewriter writes instead.


_KERAS_EXPERIMENTAL = "tensorflow.keras.mixed_precision.experimental"
_LOSS_SCALE_NAMESPACES = (
    "tensorflow.train.experimental",
    "tensorflow.compat.v1.train.experimental",
    "tensorflow.compat.v2.train.experimental",
    "tensorflow.mixed_precision.experimental",
    "tensorflow.compat.v1.mixed_precision",
    "tensorflow.compat.v1.mixed_precision.experimental",
)
_V1_OPTIMIZER_NAMESPACES = (
    "tensorflow.compat.v1.train.experimental",
    "tensorflow.compat.v1.mixed_precision",
)

LEGACY_NAMES: Dict[str, LegacyName] = {
    **{f"{ns}.{cls}": LegacyName(f"tf_lossscale.{cls}", f"tf_lossscale.{cls}")
       for ns in _LOSS_SCALE_NAMESPACES
       for cls in ("LossScale", "FixedLossScale", "DynamicLossScale")},
    **{f"{ns}.MixedPrecisionLossScaleOptimizer": LegacyName(
        "tf_lossscale.MixedPrecisionLossScaleOptimizer",
        "tf_lossscale.MixedPrecisionLossScaleOptimizer")
       for ns in _V1_OPTIMIZER_NAMESPACES},
    # `loss_scale=` becomes dynamic/initial_scale/dynamic_growth_steps.
    f"{_KERAS_EXPERIMENTAL}.LossScaleOptimizer": LegacyName(
        "tf_lossscale.experimental.LossScaleOptimizer",
        "tf_lossscale.LossScaleOptimizer"),
    # TF 2.1-2.3's policy API; the current Policy takes no `loss_scale`.
    f"{_KERAS_EXPERIMENTAL}.Policy": LegacyName(
        "tf_lossscale.compat.Policy",
        "tensorflow.keras.mixed_precision.Policy"),
    f"{_KERAS_EXPERIMENTAL}.set_policy": LegacyName(
        "tf_lossscale.compat.set_policy",
        "tensorflow.keras.mixed_precision.set_global_policy"),
    f"{_KERAS_EXPERIMENTAL}.global_policy": LegacyName(
        "tf_lossscale.compat.global_policy",
        "tensorflow.keras.mixed_precision.global_policy"),
}

# Namespaces today's TensorFlow no longer has: the shim creates them; the
# rewriter turns an import of one into an import of its current module, or
# drops it (None) when every member moved to tf_lossscale.
VANISHED_MODULES: Dict[str, Optional[str]] = {
    _KERAS_EXPERIMENTAL: "tensorflow.keras.mixed_precision",
    "tensorflow.mixed_precision": None,
    "tensorflow.mixed_precision.experimental": None,
}


def default_policy_loss_scale(policy_name: str) -> Optional[str]:
    """The loss scale of TF 2.1-2.3's `Policy(policy_name)` when none is given.

    "dynamic" for "mixed_float16" (float16 gradients underflow without
    scaling), None for every other policy.
    """
    return "dynamic" if policy_name == "mixed_float16" else None
