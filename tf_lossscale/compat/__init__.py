"""Run TF 2.1-2.15 loss-scaling code unchanged on today's TensorFlow.

Three ways off the legacy API, from least to most change:

- `tf_lossscale.compat.install()` in the script (or its entry point): the
  legacy names (`tf.keras.mixed_precision.experimental.*`,
  `tf.keras.mixed_precision.LossScaleOptimizer`,
  `tf.train.experimental.*LossScale`, `enable_mixed_precision_graph_rewrite`,
  ...) resolve to tf_lossscale's;
- `python -m tf_lossscale.compat SCRIPT [ARGS...]`: the same, with the
  script itself untouched;
- `python -m tf_lossscale migrate PATH...`: rewrites the source to the
  current API, which needs no shim.

The names and what they become are `legacy_names.LEGACY_NAMES`.
`LossScaleOptimizer` is TF 2.4-2.15's class (`legacy_optimizer`): ours,
applying gradients that no scaling method marked as given, as that version
did; `migrate` writes it where a module calls no scaling method on the
optimizer. The public names below load on first use, so that the rewriter (`migrate`,
`rewrite`), which imports this package, never imports TensorFlow.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = (
    "LossScaleOptimizer",
    "Policy",
    "global_policy",
    "install",
    "installed",
    "set_policy",
    "uninstall",
)

# Public name -> the module that defines it.
_HOMES = {
    "LossScaleOptimizer": "tf_lossscale.compat.legacy_optimizer",
    "Policy": "tf_lossscale.compat.policy",
    "global_policy": "tf_lossscale.compat.policy",
    "set_policy": "tf_lossscale.compat.policy",
    "install": "tf_lossscale.compat.shim",
    "installed": "tf_lossscale.compat.shim",
    "uninstall": "tf_lossscale.compat.shim",
}


def __getattr__(name: str) -> Any:
    """Loads a public name (and TensorFlow with it) on first use."""
    if name not in _HOMES:
        raise AttributeError(
            f"module 'tf_lossscale.compat' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__))
