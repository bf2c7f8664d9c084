"""The table of legacy names: what TF 2.1-2.15 code wrote, and what it becomes.

Each legacy spelling (`tensorflow` for `tf`) maps to the object the migration
shim binds it to and the name the rewriter writes instead; both read this
table, and nothing else in the package names a legacy spelling. This module
imports nothing but the standard library, so the rewriter stays free of
TensorFlow.
"""

from __future__ import annotations

from typing import Dict, FrozenSet, NamedTuple, Optional

__all__ = [
    "ALIASES",
    "GRAPH_REWRITE",
    "KERAS_OPTIMIZER_MODULES",
    "LEGACY_NAMES",
    "LOSS_SCALE_OPTIMIZERS",
    "LegacyName",
    "POLICY_CLASSES",
    "POLICY_GETTERS",
    "POLICY_SETTERS",
    "PROXIED_MODULES",
    "TEXT_NEEDLES",
    "V1_OPTIMIZER_MODULES",
    "VANISHED_MODULES",
    "canonical",
    "default_policy_loss_scale",
    "may_hold_legacy_names",
    "moved_module",
]


class LegacyName(NamedTuple):
    """What one legacy name becomes.

    Attributes:
      shim: the object the shim binds the legacy name to (dotted path).
      current: the name the rewriter writes instead; None when the rewriter
        replaces every call of it whole (see `GRAPH_REWRITE`).
      shim_tf_keras: the object the shim binds instead when `tf.keras` is
        tf_keras (TF_USE_LEGACY_KERAS=1); None if it is `shim` there too.
    """

    shim: str
    current: Optional[str]
    shim_tf_keras: Optional[str] = None


_KERAS_MP = "tensorflow.keras.mixed_precision"
_KERAS_EXPERIMENTAL = f"{_KERAS_MP}.experimental"
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
# Where TF 2.1-2.15 exported enable_/disable_mixed_precision_graph_rewrite.
_GRAPH_REWRITE_NAMESPACES = (
    "tensorflow.train.experimental",
    "tensorflow.compat.v1.train.experimental",
    "tensorflow.compat.v2.train.experimental",
    "tensorflow.mixed_precision.experimental",
    "tensorflow.compat.v1.mixed_precision",
)
_GRAPH_REWRITE_SHIM = "tf_lossscale.compat.graph_rewrite"
_POLICY_SHIM = "tf_lossscale.compat.policy"
_TF_KERAS_POLICY_SHIM = "tf_lossscale.compat.tf_keras_policy"


def _policy_api(legacy: str, current: str) -> LegacyName:
    """A TF 2.1-2.3 policy function or class, per Keras flavour."""
    return LegacyName(f"{_POLICY_SHIM}.{legacy}", f"{_KERAS_MP}.{current}",
                      f"{_TF_KERAS_POLICY_SHIM}.{legacy}")


LEGACY_NAMES: Dict[str, LegacyName] = {
    **{f"{ns}.{cls}": LegacyName(f"tf_lossscale.{cls}", f"tf_lossscale.{cls}")
       for ns in _LOSS_SCALE_NAMESPACES
       for cls in ("LossScale", "FixedLossScale", "DynamicLossScale")},
    **{f"{ns}.MixedPrecisionLossScaleOptimizer": LegacyName(
        "tf_lossscale.MixedPrecisionLossScaleOptimizer",
        "tf_lossscale.MixedPrecisionLossScaleOptimizer")
       for ns in _V1_OPTIMIZER_NAMESPACES},
    # TF 2.1-2.3: `loss_scale=` becomes dynamic/initial_scale/
    # dynamic_growth_steps.
    f"{_KERAS_EXPERIMENTAL}.LossScaleOptimizer": LegacyName(
        "tf_lossscale.compat.legacy_optimizer.ExperimentalLossScaleOptimizer",
        "tf_lossscale.LossScaleOptimizer"),
    # TF 2.4-2.15: Keras 3's class of that name lacks get_scaled_loss,
    # get_unscaled_gradients, minimize and dynamic=False, and takes
    # unmarked gradients as scaled where TF 2.4-2.15's applied them as
    # given (`legacy_optimizer`).
    f"{_KERAS_MP}.LossScaleOptimizer": LegacyName(
        "tf_lossscale.compat.legacy_optimizer.LossScaleOptimizer",
        "tf_lossscale.LossScaleOptimizer"),
    # TF 2.1-2.3's policy API; the current Policy takes no `loss_scale`.
    f"{_KERAS_EXPERIMENTAL}.Policy": _policy_api("Policy", "Policy"),
    f"{_KERAS_EXPERIMENTAL}.set_policy": _policy_api(
        "set_policy", "set_global_policy"),
    f"{_KERAS_EXPERIMENTAL}.global_policy": _policy_api(
        "global_policy", "global_policy"),
    # Rewritten call by call: an optimizer wrapper plus TensorFlow's own
    # `auto_mixed_precision` option.
    **{f"{ns}.{verb}_mixed_precision_graph_rewrite": LegacyName(
        f"{_GRAPH_REWRITE_SHIM}.{verb}_mixed_precision_graph_rewrite", None)
       for ns in _GRAPH_REWRITE_NAMESPACES for verb in ("enable", "disable")},
}

# Namespaces today's TensorFlow no longer has: the shim creates them; the
# rewriter turns an import of one into an import of its current module, or
# drops it (None) when every member moved to tf_lossscale.
VANISHED_MODULES: Dict[str, Optional[str]] = {
    _KERAS_EXPERIMENTAL: _KERAS_MP,
    "tensorflow.mixed_precision": None,
    "tensorflow.mixed_precision.experimental": None,
}

# Namespaces that are the same module object as a namespace of Keras itself
# (`tf.keras.mixed_precision is keras.mixed_precision` with Keras 3): the
# shim gives `tf.<path>` a patched copy, so `import keras` code keeps Keras'
# own names.
PROXIED_MODULES: FrozenSet[str] = frozenset({_KERAS_MP})

# Other spellings of the same objects, by prefix (the longest applies): the
# TF 2 API under `tensorflow.compat.v2`, Keras under `tensorflow.compat.v1`,
# and the private modules TF 2.1-2.5 code imported them from
# (`tensorflow.python.keras.mixed_precision...`,
# `tensorflow.python.training.experimental...`). Names are resolved through
# this before the tables above are read.
_PY_KERAS_MP = "tensorflow.python.keras.mixed_precision"
_PY_TRAINING = "tensorflow.python.training.experimental"
_COMPAT_PREFIXES: Dict[str, str] = {
    "tensorflow.compat.v2": "tensorflow",
    "tensorflow.compat.v1.keras": "tensorflow.keras",
    "tensorflow.compat.v2.compat.v1": "tensorflow.compat.v1",
}
# Private modules: the rewriter also rewrites their imports, since they
# differ from TF release to TF release.
_PRIVATE_PREFIXES: Dict[str, str] = {
    # TF 2.1-2.3.
    f"{_PY_KERAS_MP}.experimental": _KERAS_EXPERIMENTAL,
    f"{_PY_KERAS_MP}.experimental.policy": _KERAS_EXPERIMENTAL,
    f"{_PY_KERAS_MP}.experimental.loss_scale_optimizer": _KERAS_EXPERIMENTAL,
    # TF 2.4-2.5: the current class and the V1 (experimental) ones side by
    # side in one module.
    _PY_KERAS_MP: _KERAS_MP,
    f"{_PY_KERAS_MP}.policy": _KERAS_MP,
    f"{_PY_KERAS_MP}.policy.PolicyV1": f"{_KERAS_EXPERIMENTAL}.Policy",
    f"{_PY_KERAS_MP}.policy.set_policy": f"{_KERAS_EXPERIMENTAL}.set_policy",
    f"{_PY_KERAS_MP}.loss_scale_optimizer": _KERAS_MP,
    f"{_PY_KERAS_MP}.loss_scale_optimizer.LossScaleOptimizerV1":
        f"{_KERAS_EXPERIMENTAL}.LossScaleOptimizer",
    # TensorFlow's own loss scales, TF1 optimizer and graph rewrite.
    f"{_PY_TRAINING}.loss_scale": "tensorflow.mixed_precision.experimental",
    f"{_PY_TRAINING}.loss_scale_optimizer": "tensorflow.compat.v1.mixed_precision",
    f"{_PY_TRAINING}.mixed_precision": "tensorflow.compat.v1.mixed_precision",
    f"{_PY_TRAINING}.mixed_precision.enable_mixed_precision_graph_rewrite_v1":
        "tensorflow.compat.v1.mixed_precision."
        "enable_mixed_precision_graph_rewrite",
    f"{_PY_TRAINING}.mixed_precision.disable_mixed_precision_graph_rewrite_v1":
        "tensorflow.compat.v1.mixed_precision."
        "disable_mixed_precision_graph_rewrite",
}
ALIASES: Dict[str, str] = {**_COMPAT_PREFIXES, **_PRIVATE_PREFIXES}


def _resolve(name: str, prefixes: Dict[str, str]) -> str:
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        head = ".".join(parts[:end])
        if head in prefixes:
            return ".".join([prefixes[head], *parts[end:]])
    return name


def canonical(name: str) -> str:
    """`name` in the spelling the tables use (see `ALIASES`)."""
    return _resolve(name, ALIASES)


def moved_module(name: str) -> Optional[str]:
    """The public module a private one (see `ALIASES`) is spelt as now.

    None for a name that is not in a private module of the table.
    """
    resolved = _resolve(name, _PRIVATE_PREFIXES)
    return None if resolved == name else resolved


# The rewriter's view of what a call makes. Prefixes of qualified names.
KERAS_OPTIMIZER_MODULES = (
    "tensorflow.keras.optimizers.", "tensorflow.optimizers.",
    "keras.optimizers.", "tf_keras.optimizers.",
)
V1_OPTIMIZER_MODULES = ("tensorflow.compat.v1.train.", "tensorflow.train.")
LOSS_SCALE_OPTIMIZERS: FrozenSet[str] = frozenset({
    "tf_lossscale.LossScaleOptimizer",
    "tf_lossscale.experimental.LossScaleOptimizer",
    "tf_lossscale.MixedPrecisionLossScaleOptimizer",
    "keras.mixed_precision.LossScaleOptimizer",
    "keras.optimizers.LossScaleOptimizer",
    "tf_keras.mixed_precision.LossScaleOptimizer",
    *(name for name, entry in LEGACY_NAMES.items()
      if entry.current in ("tf_lossscale.LossScaleOptimizer",
                           "tf_lossscale.MixedPrecisionLossScaleOptimizer")),
})
GRAPH_REWRITE: Dict[str, bool] = {
    name: name.rsplit(".", 1)[1].startswith("enable")
    for name, entry in LEGACY_NAMES.items() if entry.current is None
}
POLICY_CLASSES: FrozenSet[str] = frozenset({
    f"{_KERAS_EXPERIMENTAL}.Policy", f"{_KERAS_MP}.Policy",
    "keras.mixed_precision.Policy", "keras.DTypePolicy",
    "keras.mixed_precision.DTypePolicy"})
POLICY_GETTERS: FrozenSet[str] = frozenset({
    f"{_KERAS_EXPERIMENTAL}.global_policy", f"{_KERAS_MP}.global_policy",
    "keras.mixed_precision.global_policy", "keras.config.dtype_policy"})
POLICY_SETTERS: FrozenSet[str] = frozenset({
    f"{_KERAS_EXPERIMENTAL}.set_policy", f"{_KERAS_MP}.set_global_policy",
    "keras.mixed_precision.set_global_policy",
    "keras.mixed_precision.set_dtype_policy", "keras.config.set_dtype_policy",
})


def default_policy_loss_scale(policy_name: str) -> Optional[str]:
    """The loss scale of TF 2.1-2.3's `Policy(policy_name)` when none is given.

    "dynamic" for "mixed_float16" (float16 gradients underflow without
    scaling), None for every other policy.
    """
    return "dynamic" if policy_name == "mixed_float16" else None


def _needles() -> FrozenSet[str]:
    """Texts one of which every file the rewriter can change contains.

    A name is reached in source by its last component (`x.DynamicLossScale`,
    `from m import DynamicLossScale`), and a module by its own name or,
    for `experimental`, through its parent's (`mixed_precision`); the
    reads rule needs `loss_scale`, the policy reads `dtype_policy`. The
    `ALIASES` reach the same last names (or, for the private modules,
    `mixed_precision` and `loss_scale` in the import).
    """
    names = [*LEGACY_NAMES, *POLICY_CLASSES, *POLICY_GETTERS,
             *POLICY_SETTERS, *LOSS_SCALE_OPTIMIZERS, *VANISHED_MODULES]
    last = {name.rsplit(".", 1)[-1] for name in names}
    last.discard("experimental")  # Reached through `mixed_precision`.
    last.discard("tensorflow")
    needles = sorted(last | {"loss_scale", "dtype_policy", "mixed_precision"})
    # Drop a needle that contains another: the shorter one finds it.
    return frozenset(n for n in needles
                     if not any(o != n and o in n for o in needles))


TEXT_NEEDLES: FrozenSet[str] = _needles()


def may_hold_legacy_names(text: str) -> bool:
    """False only if the rewriter has nothing to do in `text` (a cheap test
    that spares parsing the files of a repository that never scale)."""
    return any(needle in text for needle in TEXT_NEEDLES)
