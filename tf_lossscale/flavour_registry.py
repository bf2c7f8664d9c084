"""The flavour registry: which class wraps which inner optimizer.

Each public LossScaleOptimizer class (`optimizer.LossScaleOptimizer`, and
`experimental.LossScaleOptimizer` for the deprecated twins) keeps a table
of its flavours, each with a predicate saying which inner optimizers it
wraps; a flavour joins with one class statement (`wraps=<predicate>`).
`tf_lossscale/__init__.py` says which module serves which Keras
(`add_flavour_loader`), so a flavour whose Keras is not in use is never
imported until an optimizer of that Keras is wrapped.

Here too, the errors of a wrong pick: `reject_loss_scale_optimizer` (no
LossScaleOptimizer wraps another) and `wrong_family` (a flavour class
called with an optimizer of another family).
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple, cast

__all__ = [
    "Predicate",
    "add_flavour_loader",
    "derive",
    "flavours_of",
    "frozen_keras_hint",
    "is_flavour",
    "joined",
    "legacy_keras_requested",
    "load_flavours",
    "load_flavours_for",
    "register",
    "reject_loss_scale_optimizer",
    "type_name",
    "wrong_family",
]

Predicate = Callable[[Any], bool]

# Public class -> [(accepts inner optimizer?, flavour)], in definition order.
_REGISTRY: Dict[type, List[Tuple[Predicate, type]]] = {}
# A subclass of a public class that names no flavour (a user's) -> that
# public class; and (such a subclass, flavour) -> the class joining them.
_DERIVED: Dict[type, type] = {}
_JOINED: Dict[Tuple[type, type], type] = {}
# (top-level package of an optimizer's type, module that serves it).
_LOADERS: List[Tuple[str, str]] = []


def register(public: type, wraps: Predicate, flavour: type) -> None:
    """Enters `flavour`, which wraps what `wraps` accepts, under `public`."""
    _REGISTRY.setdefault(public, []).append((wraps, flavour))


def flavours_of(public: type) -> List[Tuple[Predicate, type]]:
    """The flavours registered under `public`, in definition order.

    For a class `derive` entered, its parent's flavours, each joined with
    it (`joined`).
    """
    parent = _DERIVED.get(public)
    if parent is None:
        return _REGISTRY.get(public, [])
    return [(accepts, joined(public, flavour))
            for accepts, flavour in flavours_of(parent)]


def is_flavour(cls: type) -> bool:
    """Whether `cls` is, or derives from, a registered flavour."""
    flavours = {f for entries in _REGISTRY.values() for _, f in entries}
    return any(base in flavours for base in cls.__mro__)


def derive(cls: type, parent: type) -> None:
    """Enters `cls`, a subclass of the public class `parent` that names no
    flavour: it picks the flavour its parent would, joined with itself."""
    _DERIVED[cls] = parent


def joined(cls: type, flavour: type) -> type:
    """The class of `cls` (a derived public class) and `flavour`: `cls`'s
    methods first, then the flavour's; named as `cls`, so `type(opt)`,
    `repr` and a saved config name the user's class."""
    key = (cls, flavour)
    if key not in _JOINED:
        _JOINED[key] = type(cls.__name__, (cls, flavour), {
            "__module__": cls.__module__, "__qualname__": cls.__qualname__,
            "__doc__": cls.__doc__})
        # Its Keras saves it under a name that loads `cls` (which picks the
        # flavour again): the flavour knows which Keras that is.
        cast(Any, flavour)._register_joined(_JOINED[key], cls)
    return _JOINED[key]


def add_flavour_loader(package: str, module: str) -> None:
    """Declares that `module` defines the flavour for `package`'s optimizers.

    It is imported the first time an optimizer (or config) of `package` is
    wrapped and no registered flavour accepts it.
    """
    if (package, module) not in _LOADERS:
        _LOADERS.append((package, module))


def load_flavours(package: Optional[str]) -> bool:
    """Imports the modules serving `package` (every package if None)."""
    loaded = False
    for name, module in _LOADERS:
        if (package is None or name == package) and module not in sys.modules:
            importlib.import_module(module)
            loaded = True
    return loaded


def load_flavours_for(inner_optimizer: Any) -> bool:
    """Imports the modules serving the packages `inner_optimizer`'s class
    and its bases come from: a user's (or Model Garden's) subclass of a
    tf_keras optimizer, defined in a module of its own, is served by the
    tf_keras flavours."""
    packages = dict.fromkeys(cls.__module__.split(".")[0]
                             for cls in type(inner_optimizer).__mro__)
    loaded = False
    for package in packages:
        loaded = load_flavours(package) or loaded
    return loaded


def type_name(obj: Any) -> str:
    """The module-qualified name of `obj`'s type."""
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def frozen_keras_hint(inner_optimizer: Any) -> str:
    """What to use instead of TensorFlow's frozen private Keras 2.4 copy."""
    frozen = [cls for cls in type(inner_optimizer).__mro__
              if cls.__module__.startswith("tensorflow.python.keras.")]
    if not frozen:
        return ""
    return (" TensorFlow's frozen private copy of Keras 2.4 "
            "(tensorflow.python.keras) is not supported: use the same "
            f"optimizer from tf_keras.optimizers.legacy (tf_keras.optimizers."
            f"legacy.{frozen[0].__name__}), which has its API.")


def legacy_keras_requested() -> bool:
    """Whether `tf.keras` is tf_keras in this process (TF's own test)."""
    return os.environ.get("TF_USE_LEGACY_KERAS", "").lower() in ("1", "true")


def _loss_scale_optimizer_types() -> tuple:
    """Every LossScaleOptimizer class loaded in this process."""
    types: List[type] = list(_REGISTRY)  # The public classes.
    for package in ("keras", "tf_keras"):
        module = sys.modules.get(package)  # Not loaded: nothing to reject.
        if module is not None:
            types.append(module.mixed_precision.LossScaleOptimizer)
    return tuple(types)


def reject_loss_scale_optimizer(inner_optimizer: Any) -> None:
    """Raises `TypeError` if `inner_optimizer` is a LossScaleOptimizer.

    Any of them: this package's, Keras 3's, tf_keras'. Wrapping one would
    scale the loss twice and skip steps on a stale verdict.
    """
    if isinstance(inner_optimizer, _loss_scale_optimizer_types()):
        raise TypeError(
            "A LossScaleOptimizer cannot wrap another LossScaleOptimizer; got "
            f"{type_name(inner_optimizer)} "
            f"{getattr(inner_optimizer, 'name', '')!r}. Pass the optimizer "
            "it wraps (its `inner_optimizer`) instead.")


def wrong_family(inner_optimizer: Any, flavour: type,
                 accepted: str) -> TypeError:
    """The error of a flavour class called with what it does not wrap.

    As tf_keras' class of each family refuses the other family's optimizers,
    it names what was passed, what `flavour` accepts (`accepted`) and the
    class to use: the public class the flavour is registered under, which
    picks the flavour, and the flavour it picks for this optimizer.
    """
    public: Any = next(c for c in flavour.__mro__
                       if vars(c).get("_PICKS_FLAVOUR"))
    public_name = ("tf_lossscale.LossScaleOptimizer" if public.__module__
                   == "tf_lossscale.optimizer" else
                   f"{public.__module__}.{public.__qualname__}")
    try:
        right: Optional[type] = public._flavour_for(inner_optimizer)
    except TypeError:
        right = None
    use = (f"Pass an optimizer it wraps, or use {public_name}, which builds "
           "the class for each family" if right is None else
           f"Use {public_name}, which builds the class for each family: for "
           f"this one, {right.__module__}.{right.__qualname__}")
    return TypeError(
        f"{flavour.__name__} wraps one family of optimizers: {accepted}. Got "
        f"{inner_optimizer!r} of type {type_name(inner_optimizer)}. {use}.")
