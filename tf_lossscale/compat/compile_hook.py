"""`model.compile` under the shim wraps the optimizer as TF 2.1-2.15 did.

TF 2.1-2.3's compile wrapped the optimizer in the experimental
`LossScaleOptimizer` with the loss scale of the model's `Policy`; TF 2.4-2.15
wrapped it in `tf.keras.mixed_precision.LossScaleOptimizer` (dynamic) under
the "mixed_float16" policy. Today's Kerases wrap in their own class inline,
unless the optimizer already is an instance of it, and offer no hook; so the
shim wraps `Model.compile` (`hooked`) to pass compile an optimizer already
wrapped in tf_lossscale's class, which is an instance of the Keras class
each Keras checks for. `isinstance(model.optimizer,
tf.keras.mixed_precision.LossScaleOptimizer)` then holds under the shim, and
`model.optimizer` has TensorFlow's documented API.
"""

from __future__ import annotations

import functools
import sys
import warnings
from typing import Any, Callable, Optional, Tuple

import keras

import tf_lossscale
from tf_lossscale.compat import legacy_optimizer
from tf_lossscale.compat.policy import LossScaleMixin

__all__ = ["hooked", "optimizer_for_compile"]

Get = Callable[[Any], Any]


def _loss_scale_optimizer_types() -> Tuple[type, ...]:
    """Every LossScaleOptimizer class compile keeps as it is."""
    types = [tf_lossscale.LossScaleOptimizer,
             keras.mixed_precision.LossScaleOptimizer]
    tf_keras = sys.modules.get("tf_keras")
    if tf_keras is not None:
        types.append(tf_keras.mixed_precision.LossScaleOptimizer)
    return tuple(types)


def optimizer_for_compile(policy: Any, optimizer: Any, get: Get,
                          auto_scale_loss: bool = True) -> Any:
    """The optimizer TF 2.1-2.15's `model.compile` used under `policy`.

    Args:
      policy: the model's dtype policy.
      optimizer: what was passed to compile (an optimizer, a name, None).
      get: the Keras' `optimizers.get`, turning a name into an optimizer.
      auto_scale_loss: Keras 3's compile argument; False asks for no
        wrapping.

    Returns:
      Under a TF 2.1-2.3 `Policy` with a loss scale, the experimental
      `LossScaleOptimizer(optimizer, policy.loss_scale)`; under the
      "mixed_float16" policy, TF 2.4-2.15's class
      (`legacy_optimizer.LossScaleOptimizer(optimizer)`);
      else, or if `optimizer` already is a loss-scale optimizer (or None),
      `optimizer` unchanged.
    """
    if optimizer is None or not auto_scale_loss:
        return optimizer
    legacy = isinstance(policy, LossScaleMixin)
    if legacy and policy.loss_scale is None:
        return optimizer
    if not legacy and getattr(policy, "name", None) != "mixed_float16":
        return optimizer
    optimizer = get(optimizer)
    if isinstance(optimizer, _loss_scale_optimizer_types()):
        return optimizer
    if not legacy:
        return legacy_optimizer.LossScaleOptimizer(optimizer)
    with warnings.catch_warnings():
        # TF 2.3's compile chose this class itself; the user did not.
        warnings.simplefilter("ignore", DeprecationWarning)
        return legacy_optimizer.ExperimentalLossScaleOptimizer(
            optimizer, policy.loss_scale)


def hooked(compile_fn: Callable[..., Any], get: Get,
           keras_3: bool) -> Callable[..., Any]:
    """`compile_fn` (a Model's compile), wrapping the optimizer first.

    Args:
      compile_fn: `Model.compile` of one Keras.
      get: that Keras' `optimizers.get`.
      keras_3: True for Keras 3, whose compile takes `auto_scale_loss`.
    """

    @functools.wraps(compile_fn)
    def compile(self: Any, optimizer: Any = "rmsprop", *args: Any,
                **kwargs: Any) -> Any:  # noqa: A001
        policy = self.dtype_policy
        auto: Optional[bool] = kwargs.get("auto_scale_loss", True)
        optimizer = optimizer_for_compile(policy, optimizer, get,
                                          auto_scale_loss=bool(auto))
        if keras_3 and isinstance(policy, LossScaleMixin) and (
                policy.loss_scale is None):
            # TF 2.3 scaled nothing then; Keras 3 would, for float16.
            kwargs.setdefault("auto_scale_loss", False)
        return compile_fn(self, optimizer, *args, **kwargs)

    return compile
