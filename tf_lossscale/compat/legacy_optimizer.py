"""TF 2.4-2.15's `tf.keras.mixed_precision.LossScaleOptimizer`, as the shim
binds that name.

It is `tf_lossscale.LossScaleOptimizer` with one rule of its original: the
gradients `apply_gradients` gets when no scaling method ran are applied as
given (unscaled), as TF 2.4-2.15's class applied them. Code of that time
with `compile` under a `mixed_float16` policy and a custom `train_step`
that applies `tape.gradient(loss)` trains as it did; Keras 3's `fit` calls
`scale_loss`, which marks its gradients as scaled, so `fit` is unchanged.
`tf_lossscale.LossScaleOptimizer` used directly keeps Keras 3's rule.

`ExperimentalLossScaleOptimizer` is what the shim binds TF 2.1-2.3's
`tf.keras.mixed_precision.experimental.LossScaleOptimizer` to: the
deprecated class, and (as TF 2.4-2.15's experimental class subclassed the
current one) an instance of `LossScaleOptimizer` above, so legacy
`isinstance(opt, mixed_precision.LossScaleOptimizer)` checks hold for both.
"""

from __future__ import annotations

from typing import ClassVar

import tf_lossscale

__all__ = ["ExperimentalLossScaleOptimizer", "LossScaleOptimizer"]


class LossScaleOptimizer(tf_lossscale.LossScaleOptimizer):
    """TF 2.4-2.15's `tf.keras.mixed_precision.LossScaleOptimizer`.

    `tf_lossscale.LossScaleOptimizer`, with the same arguments and
    methods, except one rule: gradients that `apply_gradients` gets when no
    scaling method (`scale_loss`, `get_scaled_loss`,
    `get_unscaled_gradients`) ran are applied as given, as TF 2.4-2.15's
    class applied them, where `tf_lossscale.LossScaleOptimizer` takes them
    as scaled on Keras 3 (as Keras 3 does). The shim binds the legacy name
    to it, and `migrate` writes it where a module applies gradients with no
    scaling call on the optimizer.
    """

    _UNMARKED_GRADIENTS_ARE_SCALED: ClassVar[bool] = False


class ExperimentalLossScaleOptimizer(tf_lossscale.experimental.LossScaleOptimizer,
                                     LossScaleOptimizer):
    """TF 2.1-2.3's class under the shim (`(optimizer, loss_scale)`)."""
