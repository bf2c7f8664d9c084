"""`InnerAttribute`: a hyperparameter read and written on the inner optimizer."""

from __future__ import annotations

from typing import Any

__all__ = ["InnerAttribute"]


class InnerAttribute:
    """A hyperparameter of the LossScaleOptimizer, kept on its inner optimizer.

    An explicit, named property (as Keras writes `learning_rate`), declared
    once per name: `momentum = InnerAttribute("momentum")`. Until the
    instance has its `inner_optimizer`, writes are dropped: those are the
    base optimizer constructor storing its own defaults, which a
    LossScaleOptimizer does not use.
    """

    def __init__(self, name: str) -> None:
        self._name = name

    def _inner(self, obj: Any) -> Any:
        return vars(obj).get("inner_optimizer")

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        inner = self._inner(obj)
        if inner is None or not hasattr(inner, self._name):
            raise AttributeError(
                f"{type(obj).__name__} has no {self._name!r}: it reads that "
                "hyperparameter from its inner optimizer "
                f"{type(inner).__name__}, which has none.")
        return getattr(inner, self._name)

    def __set__(self, obj: Any, value: Any) -> None:
        inner = self._inner(obj)
        if inner is None:
            return
        if not hasattr(inner, self._name):
            raise AttributeError(
                f"Cannot set {self._name!r} on {type(obj).__name__}: its "
                f"inner optimizer {type(inner).__name__} has no such "
                "hyperparameter.")
        setattr(inner, self._name, value)

