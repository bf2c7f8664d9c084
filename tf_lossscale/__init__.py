"""tf_lossscale: loss scaling for mixed-precision TensorFlow training.

The documented TensorFlow loss-scaling API (`LossScale`, `FixedLossScale`,
`DynamicLossScale`, the Keras `LossScaleOptimizer` and its deprecated
`experimental` twin, the TF1 `MixedPrecisionLossScaleOptimizer`) on today's
TensorFlow, with Keras 3 and tf_keras.
"""

from tf_lossscale.loss_scale import DynamicLossScale
from tf_lossscale.loss_scale import FixedLossScale
from tf_lossscale.loss_scale import LossScale
from tf_lossscale.loss_scale import deserialize
from tf_lossscale.loss_scale import get
from tf_lossscale.loss_scale import serialize
from tf_lossscale.v1_optimizer import MixedPrecisionLossScaleOptimizer
from tf_lossscale.optimizer import LossScaleOptimizer
from tf_lossscale import experimental  # Also registers the Keras 3 classes.

__version__ = "0.1.0"

__all__ = (
    "DynamicLossScale",
    "FixedLossScale",
    "LossScale",
    "LossScaleOptimizer",
    "MixedPrecisionLossScaleOptimizer",
    "deserialize",
    "experimental",
    "get",
    "serialize",
)
