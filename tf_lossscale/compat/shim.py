"""`install()` / `uninstall()`: the legacy loss-scaling names on today's TF.

`install()` binds every legacy name of `legacy_names.LEGACY_NAMES` to its
shim object (the tf_keras one when `tf.keras` is tf_keras), in the
namespaces a TF 2.1-2.15 script reaches it through:

- attributes: `tf.train.experimental.DynamicLossScale` and the like are set
  on the module objects `tf.<path>` resolves to (for `tf.keras`, the Keras
  module behind TensorFlow's lazy loader), and on `sys.modules["tensorflow.
  <path>"]` when TensorFlow has also been imported under that name;
- a namespace that is also Keras' own (`legacy_names.PROXIED_MODULES`:
  `tf.keras.mixed_precision is keras.mixed_precision`) is first replaced,
  under `tf.keras` only, by a copy, so that code that imports `keras`
  keeps Keras' own classes;
- namespaces TensorFlow no longer has (`legacy_names.VANISHED_MODULES`,
  e.g. `tf.keras.mixed_precision.experimental`) are created as modules, set
  as attributes of their parents and entered in `sys.modules`, so that
  `import tensorflow.keras.mixed_precision.experimental as mp` works;
- an import hook (`_PatchingFinder`): `import tensorflow.train.experimental`
  and the like load a second copy of a TensorFlow namespace module after
  `install()`; the hook sets the legacy names on such a copy as it loads;
- `tf.keras.Model.compile` is wrapped (on the class that defines it) so
  that it wraps the optimizer as TF 2.1-2.15 did (`compile_hook`);
- the experimental optimizer's `loss_scale` becomes TF 2.1-2.3's
  `LossScale` object (`loss_scale_view`).

Every change is recorded; `uninstall()` undoes them in reverse order, so the
namespaces hold exactly what they held before. Both are idempotent.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from tf_lossscale import experimental
from tf_lossscale.compat import compile_hook, loss_scale_view, policy
from tf_lossscale.compat import legacy_names as table

__all__ = ["install", "installed", "uninstall"]

_MISSING = object()


class _Changes:
    """Attribute and `sys.modules` changes, undone in reverse order."""

    def __init__(self) -> None:
        self._undo: List[Tuple[Any, str, Any]] = []

    def set(self, obj: Any, attr: str, value: Any) -> None:
        # A class's own attribute only: compile is inherited by keras.Model.
        old = (vars(obj).get(attr, _MISSING) if isinstance(obj, type)
               else getattr(obj, attr, _MISSING))
        self._undo.append((obj, attr, old))
        setattr(obj, attr, value)

    def add_module(self, name: str, module: types.ModuleType) -> None:
        self._undo.append((sys.modules, name, sys.modules.get(name,
                                                               _MISSING)))
        sys.modules[name] = module

    def undo(self) -> None:
        while self._undo:
            obj, attr, old = self._undo.pop()
            if obj is sys.modules:
                if old is _MISSING:
                    del sys.modules[attr]
                else:
                    sys.modules[attr] = old
            elif old is _MISSING:
                delattr(obj, attr)
            else:
                setattr(obj, attr, old)


def _resolve(dotted: str) -> Any:
    """The object named `dotted`, e.g. tf_lossscale.compat.Policy."""
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _plan(tf_keras: bool) -> Dict[str, Dict[str, Any]]:
    """Legacy namespace -> {name: object}, vanished namespaces included.

    A vanished namespace appears as a new module among its parent's names,
    and under its own path with its members; a proxied one as a copy among
    its parent's names, patched under its own path.
    """
    plan: Dict[str, Dict[str, Any]] = {}
    for path in sorted(table.PROXIED_MODULES):
        parent, attr = path.rsplit(".", 1)
        for module in _existing_modules(path)[:1]:
            plan.setdefault(parent, {})[attr] = _copy(module)
    for legacy, name in table.LEGACY_NAMES.items():
        namespace, attr = legacy.rsplit(".", 1)
        shim = (name.shim_tf_keras or name.shim) if tf_keras else name.shim
        plan.setdefault(namespace, {})[attr] = _resolve(shim)
    for path in sorted(table.VANISHED_MODULES):
        parent, attr = path.rsplit(".", 1)
        module = types.ModuleType(path, f"Legacy namespace {path}, "
                                  "recreated by tf_lossscale.compat.")
        plan.setdefault(parent, {})[attr] = module
    return plan


# `tensorflow.compat.v1.keras` and `tensorflow.compat.v2.keras` are Keras
# too, and once `tensorflow.keras` has been imported as a module they may
# be module objects of their own: each is patched with `tensorflow.keras`.
_KERAS_ALIASES = ("tensorflow.compat.v2.keras", "tensorflow.compat.v1.keras")


def _existing_modules(path: str) -> List[Any]:
    """The module objects `path` (tensorflow.x.y) names today, if any."""
    paths = [path]
    if path == "tensorflow.keras" or path.startswith("tensorflow.keras."):
        paths += [alias + path[len("tensorflow.keras"):]
                  for alias in _KERAS_ALIASES]
    found: List[Any] = []
    for name in paths:
        for module in (_walk(name), sys.modules.get(name)):
            if module is not None and all(module is not m for m in found):
                found.append(module)
    return found


def _walk(path: str) -> Any:
    """The object `path` (tensorflow.x.y) names by attributes, or None."""
    obj: Any = sys.modules["tensorflow"]
    try:
        for attr in path.split(".")[1:]:
            obj = getattr(obj, attr)
    except AttributeError:
        return None
    return obj


class _PatchingLoader(importlib.abc.Loader):
    """Loads a TensorFlow namespace module, then sets the legacy names."""

    def __init__(self, loader: importlib.abc.Loader,
                 names: Dict[str, Any], changes: _Changes) -> None:
        self._loader = loader
        self._names = names
        self._changes = changes

    def create_module(self, spec: importlib.machinery.ModuleSpec
                      ) -> Optional[types.ModuleType]:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._loader.exec_module(module)
        for attr, value in self._names.items():
            self._changes.set(module, attr, value)


class _PatchingFinder(importlib.abc.MetaPathFinder):
    """Finds legacy namespace modules with the next finder, then patches."""

    def __init__(self, plan: Dict[str, Dict[str, Any]],
                 changes: _Changes) -> None:
        self._plan = plan
        self._changes = changes

    def find_spec(self, fullname: str, path: Optional[Sequence[str]],
                  target: Optional[types.ModuleType] = None
                  ) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname not in self._plan:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _PatchingLoader(
                        spec.loader, self._plan[fullname], self._changes)
                return spec
        return None


def _current_loss_scale(optimizer: Any) -> Any:
    """The experimental optimizer's `loss_scale` as the core defines it."""
    return super(experimental.LossScaleOptimizer, optimizer).loss_scale


def _copy(module: types.ModuleType) -> types.ModuleType:
    """A new module object holding what `module` holds."""
    copy = types.ModuleType(module.__name__, module.__doc__)
    copy.__dict__.update(vars(module))
    return copy


_installed: Optional[Tuple[_Changes, _PatchingFinder]] = None


def install() -> None:
    """Makes the legacy loss-scaling names resolve; does nothing if done.

    Raises:
      AttributeError, ImportError: a namespace or object the table names
        does not exist (nothing is changed then).
    """
    global _installed
    if _installed is not None:
        return
    tf_keras = policy.tf_keras_is_tf_keras()
    plan = _plan(tf_keras)
    changes = _Changes()
    try:
        _apply(plan, changes, tf_keras)
    except BaseException:
        changes.undo()
        raise
    finder = _PatchingFinder(
        {path: names for path, names in plan.items()
         if path not in table.VANISHED_MODULES}, changes)
    sys.meta_path.insert(0, finder)
    _installed = (changes, finder)


def _apply(plan: Dict[str, Dict[str, Any]], changes: _Changes,
           tf_keras: bool) -> None:
    vanished = {}
    for path in sorted(table.VANISHED_MODULES):
        parent, attr = path.rsplit(".", 1)
        vanished[path] = plan[parent][attr]
        changes.add_module(path, vanished[path])
    for path in sorted(plan):
        targets = ([vanished[path]] if path in vanished
                   else _existing_modules(path))
        if not targets:
            raise AttributeError(
                f"TensorFlow {sys.modules['tensorflow'].__version__} has no "
                f"namespace {path}, which tf_lossscale.compat patches.")
        for target in targets:
            for attr, value in plan[path].items():
                changes.set(target, attr, value)
    # Hooked on the class that defines it (Keras 3: its Trainer), so that
    # Keras' "is compile overridden?" checks (`cls.compile !=
    # Trainer.compile`, before `compile_from_config` when a model loads)
    # still find Keras' own compile.
    owner = next(cls for cls in tf.keras.Model.__mro__
                 if "compile" in vars(cls))
    changes.set(owner, "compile", compile_hook.hooked(
        vars(owner)["compile"], tf.keras.optimizers.get,
        keras_3=not tf_keras))
    changes.set(experimental.LossScaleOptimizer, "loss_scale",
                loss_scale_view.view_property(_current_loss_scale))


def uninstall() -> None:
    """Restores what `install()` changed; does nothing if not installed."""
    global _installed
    if _installed is None:
        return
    changes, finder = _installed
    if finder in sys.meta_path:
        sys.meta_path.remove(finder)
    changes.undo()
    _installed = None


def installed() -> bool:
    """True between `install()` and `uninstall()`."""
    return _installed is not None
