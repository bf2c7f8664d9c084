"""Run TF 2.1-2.4 loss-scaling code unchanged on today's TensorFlow.

Three ways off the legacy API, from least to most change:

- `tf_lossscale.compat.install()` in the script (or its entry point): the
  legacy names (`tf.keras.mixed_precision.experimental.*`,
  `tf.train.experimental.*LossScale`, ...) resolve to tf_lossscale's;
- `python -m tf_lossscale.compat SCRIPT [ARGS...]`: the same, with the
  script itself untouched;
- `python -m tf_lossscale migrate PATH...`: rewrites the source to the
  current API, which needs no shim.

The names and what they become are `legacy_names.LEGACY_NAMES`.
"""

from tf_lossscale.compat.policy import Policy
from tf_lossscale.compat.policy import global_policy
from tf_lossscale.compat.policy import set_policy
from tf_lossscale.compat.shim import install
from tf_lossscale.compat.shim import installed
from tf_lossscale.compat.shim import uninstall

__all__ = (
    "Policy",
    "global_policy",
    "install",
    "installed",
    "set_policy",
    "uninstall",
)
