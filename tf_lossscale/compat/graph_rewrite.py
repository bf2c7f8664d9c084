"""TF 2.1-2.15's `enable_mixed_precision_graph_rewrite(opt, loss_scale)`.

TensorFlow's function wrapped `opt` in a loss-scale optimizer (a Keras
optimizer in the experimental Keras `LossScaleOptimizer`, a
`tf.compat.v1.train.Optimizer` in `MixedPrecisionLossScaleOptimizer`) and
turned on its own `auto_mixed_precision` graph rewrite, which casts
`tf.function` and Session graphs to float16 on GPUs with Tensor Cores. The
graph rewrite still exists; TensorFlow's function only wraps in its own TF1
class and refuses Keras 3 optimizers. These do what it did, with
tf_lossscale's wrappers. `disable_mixed_precision_graph_rewrite()` turns the
rewrite off again.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import keras
import tensorflow as tf

import tf_lossscale
from tf_lossscale import _tf_private
from tf_lossscale.compat import legacy_optimizer

__all__ = ["disable_mixed_precision_graph_rewrite",
           "enable_mixed_precision_graph_rewrite", "wrap_optimizer"]

_OPTION = "auto_mixed_precision"


def _is_mixed_policy() -> bool:
    """True when tf.keras' global dtype policy is a mixed one."""
    mixed_precision = tf.keras.mixed_precision
    return mixed_precision.global_policy().name.startswith("mixed_")


def _is_loss_scale_optimizer(opt: Any) -> bool:
    types = [tf_lossscale.LossScaleOptimizer,
             tf_lossscale.MixedPrecisionLossScaleOptimizer,
             tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer]
    for module in ("keras", "tf_keras"):
        if module in sys.modules:
            types.append(sys.modules[module].mixed_precision.
                         LossScaleOptimizer)
    return isinstance(opt, tuple(types))


def _is_keras_optimizer(opt: Any) -> bool:
    """True for an optimizer of Keras 3 or of tf_keras (either family)."""
    types = [keras.optimizers.Optimizer]
    tf_keras = sys.modules.get("tf_keras")
    if tf_keras is not None:
        types += [tf_keras.optimizers.Optimizer,
                  tf_keras.optimizers.legacy.Optimizer]
    return isinstance(opt, tuple(types))


def wrap_optimizer(opt: Any, loss_scale: Any = "dynamic") -> Any:
    """`opt` in the loss-scale optimizer TF's graph rewrite chose for it.

    Raises:
      ValueError: `opt` already is a loss-scale optimizer, or is no
        optimizer (as TensorFlow's function raised).
    """
    if _is_loss_scale_optimizer(opt):
        raise ValueError(
            f'"opt" must not already be a loss-scale optimizer; got {opt!r}. '
            "enable_mixed_precision_graph_rewrite wraps the optimizer "
            "itself: pass the optimizer it wraps.")
    if isinstance(opt, tf.compat.v1.train.Optimizer):
        return tf_lossscale.MixedPrecisionLossScaleOptimizer(opt, loss_scale)
    if not _is_keras_optimizer(opt):
        raise ValueError(
            '"opt" must be an instance of a tf.compat.v1.train.Optimizer or '
            f"of a Keras optimizer, but got {opt!r} of type "
            f"{type(opt).__name__}.")
    with warnings.catch_warnings():
        # TF chose the deprecated class itself; the user did not.
        warnings.simplefilter("ignore", DeprecationWarning)
        return legacy_optimizer.ExperimentalLossScaleOptimizer(opt, loss_scale)


def enable_mixed_precision_graph_rewrite(opt: Any,
                                         loss_scale: Any = "dynamic") -> Any:
    """Wraps `opt` for loss scaling and turns on TF's float16 graph rewrite.

    Args:
      opt: a Keras optimizer (of Keras 3 or tf_keras), or a
        `tf.compat.v1.train.Optimizer`.
      loss_scale: "dynamic", a number >= 1 or a `LossScale`.

    Returns:
      The wrapped optimizer: the experimental `LossScaleOptimizer` (TF
      2.1-2.3's class, `legacy_optimizer.ExperimentalLossScaleOptimizer`)
      for a Keras optimizer, `tf_lossscale.MixedPrecisionLossScaleOptimizer`
      for a TF1 one.

    Raises:
      ValueError: the global Keras policy is a mixed one (only one of the
        two mixed precision APIs may be used), or `opt` is not accepted.
    """
    if _is_mixed_policy():
        raise ValueError(
            "The mixed precision graph rewrite cannot be enabled, because "
            "the global Keras dtype policy is a mixed precision policy "
            f"({tf.keras.mixed_precision.global_policy().name!r}); use one "
            "of the two mixed precision APIs, not both.")
    wrapped = wrap_optimizer(opt, loss_scale)
    tf.config.optimizer.set_experimental_options({_OPTION: True})
    _tf_private.mixed_precision_graph_rewrite_state(
    ).set_mixed_precision_graph_rewrite_enabled(True)
    return wrapped


def disable_mixed_precision_graph_rewrite() -> None:
    """Turns TF's float16 graph rewrite off for new functions and Sessions.

    Optimizers already wrapped keep scaling the loss, as in TensorFlow.
    """
    if not _tf_private.mixed_precision_graph_rewrite_state(
    ).is_mixed_precision_graph_rewrite_enabled():
        tf.get_logger().warning(
            "disable_mixed_precision_graph_rewrite() called when mixed "
            "precision is already disabled.")
    tf.config.optimizer.set_experimental_options({_OPTION: False})
    _tf_private.mixed_precision_graph_rewrite_state(
    ).set_mixed_precision_graph_rewrite_enabled(False)
