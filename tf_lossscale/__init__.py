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

import os as _os
import sys as _sys

if "tf_keras" in _sys.modules or _os.environ.get(
        "TF_USE_LEGACY_KERAS") in ("1", "true", "True"):  # TF's own test.
    # Registers the tf_keras classes for tf_keras.models.load_model. Else
    # they register when the first tf_keras optimizer is wrapped, or on
    # `import tf_lossscale.tf_keras_optimizer`.
    from tf_lossscale import tf_keras_optimizer  # noqa: F401
del _os, _sys

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
