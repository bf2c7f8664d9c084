"""What both tf_keras flavours check, as tf_keras' own wrapper checks it.

tf_keras' two families (`tf_keras.optimizers.Optimizer` and the legacy
`tf_keras.optimizers.legacy.Optimizer`) each have a flavour
(`tf_keras_optimizer`, `tf_keras_legacy_optimizer`); tf_keras' wrapper
checks the same things for both, and so do they, through this module:

- `reject_already_wrapped`: an inner optimizer is wrapped only once;
- `checked_pairs`: the (gradient, variable) pairs `apply_gradients` is
  handed;
- `ScalingWarnings`: tf_keras' warning when `apply_gradients` runs without
  `get_scaled_loss` and `get_unscaled_gradients`, and its reading of
  gradients that neither marked (unscaled).

It imports no flavour: both flavours import it.
"""

from __future__ import annotations

from typing import Any, Iterable, List, Sequence, Tuple

import tensorflow as tf

from tf_lossscale import _tf_private, distribute
from tf_lossscale import optimizer as optimizer_lib

__all__ = [
    "ScalingWarnings",
    "checked_pairs",
    "reject_already_wrapped",
]

# What tf_keras' warning shows as the documented flow.
_EXAMPLE = """
    with tf.GradientTape() as tape:
      loss = loss_fn()
      scaled_loss = opt.get_scaled_loss(loss)
    scaled_grads = tape.gradient(scaled_loss, vars)
    grads = opt.get_unscaled_gradients(scaled_grads)
    opt.apply_gradients([(grads, var)])"""


def reject_already_wrapped(inner_optimizer: Any) -> None:
    """Raises `ValueError` if a tf_keras LossScaleOptimizer wraps it already.

    Ours or tf_keras' (they share the mark), of either family.
    """
    if _tf_private.is_wrapped_by_loss_scale_optimizer(inner_optimizer):
        raise ValueError(
            '"inner_optimizer" is already wrapped by a LossScaleOptimizer. '
            "A tf_keras optimizer can be wrapped by only one, because the "
            "wrapper writes its loss scale into the inner optimizer's "
            f"checkpoint. Got {inner_optimizer!r}; wrap a new optimizer.")


def checked_pairs(grads_and_vars: Iterable[Tuple[Any, Any]]
                  ) -> List[Tuple[Any, Any]]:
    """The (gradient, variable) pairs that have a gradient; raises on bad input.

    Both tf_keras flavours' `apply_gradients` start here.

    Raises:
      ValueError: called in a cross-replica context, every gradient is None,
        or a gradient's shape does not fit its variable.
      TypeError: a gradient is not floating point.
    """
    distribute.require_replica_context("apply_gradients()")
    pairs = list(grads_and_vars)
    kept = [(g, v) for g, v in pairs if g is not None]
    if pairs and not kept:
        raise ValueError(
            "No gradients provided for any variable: every gradient is "
            f"None for {[v.name for _, v in pairs]}.")
    optimizer_lib.check_gradients([g for g, _ in kept], [v for _, v in kept])
    return kept


class ScalingWarnings(optimizer_lib.LossScaleOptimizer, flavour_part=True):
    """tf_keras' warning when `apply_gradients` misses a scaling method.

    Both tf_keras wrappers remember whether `get_scaled_loss` and
    `get_unscaled_gradients` were ever called on them, and every
    `apply_gradients` until both were warns, through `tf_logging.warning`
    (where code, tf_keras' tests among it, looks for it), naming the one or
    two that were not. The tf_keras flavours of this package do the same.
    Which gradients are taken as scaled is `GradientMarks`' rule; with no
    mark, tf_keras takes them as they are, unscaled.
    """

    _loss_has_been_scaled = False
    _gradients_have_been_unscaled = False

    @tf.autograph.experimental.do_not_convert
    def get_scaled_loss(self, loss: optimizer_lib.Loss) -> optimizer_lib.Loss:
        self._loss_has_been_scaled = True
        return super().get_scaled_loss(loss)

    @tf.autograph.experimental.do_not_convert
    def get_unscaled_gradients(self, grads: Sequence[Any]) -> List[Any]:
        self._gradients_have_been_unscaled = True
        return super().get_unscaled_gradients(grads)

    def _unmarked_gradients_are_scaled(self) -> bool:
        return False

    def _warn_about_scaling(self) -> None:
        """Warns as tf_keras does, unless both scaling methods have run."""
        scaled = self._loss_has_been_scaled
        unscaled = self._gradients_have_been_unscaled
        if scaled and unscaled:
            return
        if not scaled and not unscaled:
            message = (
                "You forgot to call LossScaleOptimizer.get_scaled_loss() and "
                "LossScaleOptimizer.get_unscaled_gradients() before calling "
                "LossScaleOptimizer.apply_gradients(). The gradients are "
                "applied as they are, unscaled, as tf_keras does: without "
                "loss scaling, float16 gradients may underflow, which will "
                "likely result in worse model quality.")
        elif not unscaled:
            message = (
                "You forgot to call LossScaleOptimizer.get_unscaled_gradients"
                "() before calling LossScaleOptimizer.apply_gradients() (you "
                "did call get_scaled_loss() however). Gradients computed "
                "since a get_scaled_loss() call are divided by the loss scale "
                "here; call get_unscaled_gradients() to clip or inspect them "
                "unscaled.")
        else:
            message = (
                "You forgot to call LossScaleOptimizer.get_scaled_loss() "
                "before calling LossScaleOptimizer.apply_gradients() (you did "
                "call get_unscaled_gradients() however). Unscaling gradients "
                "of a loss that was not scaled divides them by the loss "
                "scale, which will likely result in worse model quality.")
        _tf_private.tf_logging_warning(
            f"{message} For example:{_EXAMPLE}")
