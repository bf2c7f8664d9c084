"""tf_lossscale: loss scaling for mixed-precision TensorFlow training.

The documented TensorFlow loss-scaling API (`LossScale`, `FixedLossScale`,
`DynamicLossScale`, the Keras `LossScaleOptimizer` and its deprecated
`experimental` twin, the TF1 `MixedPrecisionLossScaleOptimizer`) on today's
TensorFlow, with Keras 3 and tf_keras; plus `LossScaleMonitor`, a Keras
callback that logs the loss scale and the skipped steps, and says which
gradients made a step skip (`SkipRecord`, `SkipStreakError`).

This file is the top layer: it imports the public names and says which
module serves which Keras (`optimizer.add_flavour_loader`). Importing it
registers the Keras classes, so `keras.models.load_model` finds them. Only
when this process is the package's own command line (`python -m
tf_lossscale`, `tf-lossscale`) are the imports deferred to the first use of
a public name, so that `--help` does not start TensorFlow.
"""

import importlib as _importlib
import os as _os
import sys as _sys

__version__ = "0.3.0"

__all__ = (
    "DynamicLossScale",
    "FixedLossScale",
    "LossScale",
    "LossScaleMonitor",
    "LossScaleOptimizer",
    "MixedPrecisionLossScaleOptimizer",
    "SkipRecord",
    "SkipStreakError",
    "deserialize",
    "experimental",
    "get",
    "serialize",
)

# Public name -> the module that defines it.
_HOMES = {
    "DynamicLossScale": "tf_lossscale.loss_scale",
    "FixedLossScale": "tf_lossscale.loss_scale",
    "LossScale": "tf_lossscale.loss_scale",
    "LossScaleMonitor": "tf_lossscale.monitor",
    "LossScaleOptimizer": "tf_lossscale.optimizer",
    "MixedPrecisionLossScaleOptimizer": "tf_lossscale.v1_optimizer",
    "SkipRecord": "tf_lossscale.skip_record",
    "SkipStreakError": "tf_lossscale.skip_record",
    "deserialize": "tf_lossscale.loss_scale",
    "get": "tf_lossscale.loss_scale",
    "serialize": "tf_lossscale.loss_scale",
}

# Top-level package of an optimizer's type -> the flavour modules for it.
_FLAVOURS = {
    "keras": ("tf_lossscale.keras_optimizer",),
    "tf_keras": ("tf_lossscale.tf_keras_optimizer",
                 "tf_lossscale.tf_keras_legacy_optimizer"),
}


def _legacy_keras() -> bool:
    return "tf_keras" in _sys.modules or _os.environ.get(
        "TF_USE_LEGACY_KERAS", "").lower() in ("1", "true")


def _keras_is_aliased() -> bool:
    """Whether the program bound the name `keras` to another package (as
    `sys.modules["keras"] = tf_keras`, which TensorFlowASR needs): Keras 3
    cannot be imported by its name then, and no Keras 3 optimizer exists to
    wrap, so its flavour is not loaded."""
    bound = _sys.modules.get("keras")
    return bound is not None and getattr(bound, "__name__", "keras") != "keras"


def _load() -> None:
    """Imports the public names and wires the flavours."""
    optimizer = _importlib.import_module("tf_lossscale.optimizer")
    # Before the flavours, which import it (`from tf_lossscale import
    # experimental`): were it missing then, that import would reach
    # `__getattr__` and run `_load` again from inside a flavour's import,
    # where `hasattr` hides the failure of a nested import of another
    # flavour that saw this one half made, leaving that other flavour's
    # class registered twice.
    globals()["experimental"] = _importlib.import_module(
        "tf_lossscale.experimental")
    for package, modules in _FLAVOURS.items():
        for module in modules:
            optimizer.add_flavour_loader(package, module)
    if not _keras_is_aliased():  # Keras 3 is always installed.
        for module in _FLAVOURS["keras"]:
            _importlib.import_module(module)
    if _legacy_keras():  # tf_keras in use: register its classes too.
        for module in _FLAVOURS["tf_keras"]:
            _importlib.import_module(module)
    for name, home in _HOMES.items():
        globals()[name] = getattr(_importlib.import_module(home), name)


def _running_own_cli() -> bool:
    argv = getattr(_sys, "orig_argv", [])
    # `python -m tf_lossscale` and the shim's runner, whose `--help` must
    # not start TensorFlow either (the runner loads the names itself).
    runners = (__name__, __name__ + ".compat")
    as_module = any(a == "-m" and b in runners for a, b in zip(argv, argv[1:]))
    script = _os.path.basename(_sys.argv[0]) if _sys.argv else ""
    return as_module or script == "tf-lossscale"


def __getattr__(name: str):
    if name in __all__:
        _load()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if not _running_own_cli():
    _load()
