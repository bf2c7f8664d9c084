"""The experimental optimizer's `loss_scale`, as TF 2.1-2.3 had it.

In TF 2.1-2.3, `optimizer.loss_scale` of the experimental Keras
`LossScaleOptimizer` was a `LossScale` object: `optimizer.loss_scale()`
returned the current scale, `print(optimizer.loss_scale)` showed
`DynamicLossScale(current_loss_scale=..., num_good_steps=...,
initial_loss_scale=..., increment_period=..., multiplier=...)`, and
`get_config()` its arguments. tf_lossscale's experimental optimizer gives
the current scale itself (a tensor), as the current optimizer does.

Under the shim, `loss_scale` of `tf_lossscale.experimental.
LossScaleOptimizer` is a `LossScaleView` instead: all of the above, and
also the number TF 2.4 code used it as, since TF 2.4's experimental
optimizer (and what `enable_mixed_precision_graph_rewrite` returned) gave a
tensor there: `float(view)`, `'%g' % view`, `f"{view:.1f}"`, arithmetic on
either side and comparisons (tensors, as a variable's give), `view.numpy()`,
`np.asarray(view)`, and a tensor wherever one is expected
(`tf.convert_to_tensor`, `tf.cast`, `tf.summary.scalar`, any op), through
TensorFlow's `__tf_tensor__` protocol; eagerly and inside `tf.function`
(where, as for any tensor there, only `float()` and formatting need a
value and fail). (A stopgap until the core gives the
experimental class this attribute itself; then this module goes.)
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Dict, Optional

import numpy as np
import tensorflow as tf

__all__ = ["LossScaleView", "view_property"]


class LossScaleView:
    """The loss scale of one experimental optimizer, read live.

    Args:
      optimizer: the experimental `LossScaleOptimizer`.
      current: reads its current scale, a float32 scalar tensor.
    """

    def __init__(self, optimizer: Any,
                 current: Callable[[Any], tf.Tensor]) -> None:
        self._optimizer = optimizer
        self._current = current

    def __call__(self) -> tf.Tensor:
        """The current loss scale, a float32 scalar tensor."""
        return self._current(self._optimizer)

    def __tf_tensor__(self, dtype: Optional[tf.DType] = None,
                      name: Optional[str] = None) -> tf.Tensor:
        return tf.convert_to_tensor(self(), dtype=dtype, name=name)

    # The current scale as a number (TF 2.4 gave a tensor here).

    @property
    def dtype(self) -> tf.DType:
        return tf.float32

    def numpy(self) -> Any:
        """The current scale, a numpy float32 (eagerly)."""
        return self().numpy()

    def __float__(self) -> float:
        return float(self())

    def __int__(self) -> int:
        return int(float(self()))

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.asarray(self().numpy(), dtype=dtype)

    def __format__(self, spec: str) -> str:
        """`f"{view}"` is its repr, as the object's; `f"{view:g}"` a number."""
        return format(float(self), spec) if spec else str(self)

    def __neg__(self) -> tf.Tensor:
        return -self()

    def __abs__(self) -> tf.Tensor:
        return abs(self())

    __hash__ = object.__hash__

    @property
    def initial_loss_scale(self) -> float:
        return float(self._optimizer.initial_scale)

    @property
    def increment_period(self) -> Optional[int]:
        return self._optimizer.dynamic_growth_steps

    @property
    def multiplier(self) -> float:
        return 2.0

    # TF 2.1-2.3's private names of DynamicLossScale's variables, which
    # legacy code reads (`optimizer.loss_scale._current_loss_scale`).
    @property
    def _current_loss_scale(self) -> tf.Variable:
        return self._dynamic_variable("_current_loss_scale").scale

    @property
    def _num_good_steps(self) -> tf.Variable:
        return self._dynamic_variable("_num_good_steps").good_steps

    def _dynamic_variable(self, name: str) -> Any:
        if not self._optimizer.dynamic:
            raise AttributeError(
                f"'FixedLossScale' object has no attribute {name!r}: a fixed "
                "loss scale has no variables.")
        return self._optimizer._scale_variables

    def get_config(self) -> Dict[str, Any]:
        """The config of the `LossScale` TF 2.1-2.3 would have held."""
        if not self._optimizer.dynamic:
            return {"loss_scale_value": self.initial_loss_scale}
        return {"initial_loss_scale": self.initial_loss_scale,
                "increment_period": self.increment_period,
                "multiplier": self.multiplier}

    def __repr__(self) -> str:
        if not self._optimizer.dynamic:
            return f"FixedLossScale({self.initial_loss_scale})"
        arguments = (f"initial_loss_scale={self.initial_loss_scale}, "
                     f"increment_period={self.increment_period}, "
                     f"multiplier={self.multiplier}")
        if not tf.executing_eagerly():
            return f"DynamicLossScale({arguments})"
        current = float(self())
        good_steps = int(self._optimizer.dynamic_counter)
        return (f"DynamicLossScale(current_loss_scale={current}, "
                f"num_good_steps={good_steps}, {arguments})")


def _binary(op: Callable[[Any, Any], Any], reflected: bool) -> Any:
    """`view <op> other` (or `other <op> view`) on the current scale."""

    def method(self: LossScaleView, other: Any) -> Any:
        if isinstance(other, LossScaleView):
            other = other()
        return op(other, self()) if reflected else op(self(), other)

    return method


for _name, _op in [("add", operator.add), ("sub", operator.sub),
                   ("mul", operator.mul), ("truediv", operator.truediv),
                   ("floordiv", operator.floordiv), ("mod", operator.mod),
                   ("pow", operator.pow)]:
    setattr(LossScaleView, f"__{_name}__", _binary(_op, reflected=False))
    setattr(LossScaleView, f"__r{_name}__", _binary(_op, reflected=True))
for _name in ("lt", "le", "gt", "ge", "eq", "ne"):
    setattr(LossScaleView, f"__{_name}__",
            _binary(getattr(operator, _name), reflected=False))


def view_property(current: Callable[[Any], tf.Tensor]) -> property:
    """A `loss_scale` property returning a `LossScaleView`.

    Args:
      current: the property's getter it replaces, which returns the
        current scale as a tensor.
    """

    def loss_scale(self: Any) -> LossScaleView:
        """The loss scale, as TF 2.1-2.3's `LossScale` object."""
        return LossScaleView(self, current)

    return property(loss_scale)
