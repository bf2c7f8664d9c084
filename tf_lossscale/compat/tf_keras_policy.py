"""TF 2.1-2.3's mixed precision policy API, on tf_keras.

What the shim binds to `tf.keras.mixed_precision.experimental.Policy`,
`set_policy` and `global_policy` when `tf.keras` is tf_keras
(TF_USE_LEGACY_KERAS=1): the same API as `policy.py`, setting tf_keras'
global policy, which tf_keras layers read.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Union

import tf_keras

from tf_lossscale.compat.policy import LossScaleMixin

__all__ = ["Policy", "global_policy", "set_policy"]


class Policy(LossScaleMixin, tf_keras.mixed_precision.Policy):
    """A tf_keras dtype policy with a loss scale, as in TF 2.1-2.3.

    Args:
      name: a policy name: "mixed_float16", "mixed_bfloat16" or a float dtype
        such as "float32".
      loss_scale: "auto" (dynamic for "mixed_float16", else None),
        "dynamic", an int or float >= 1, a `tf_lossscale.LossScale`, a
        serialized one of those, or None for no loss scaling.

    Raises:
      TypeError, ValueError: `name` is not a policy name (from tf_keras).
      ValueError: `loss_scale` is none of the accepted values.
    """

    def __init__(self, name: str, loss_scale: Any = "auto") -> None:
        super().__init__(name)
        self._set_loss_scale(name, loss_scale)

    def get_config(self) -> Dict[str, Any]:
        return self._with_loss_scale(super().get_config())

    @classmethod
    def from_config(cls, config: Dict[str, Any],
                    custom_objects: Optional[Dict[str, Any]] = None
                    ) -> "Policy":
        # tf_keras' own drops a TF 2.3 `loss_scale`; this class keeps it.
        del custom_objects
        return cls(**config)


def set_policy(policy: Union[Policy, tf_keras.mixed_precision.Policy, str,
                             None]) -> None:
    """Sets tf_keras' global policy, as TF 2.1-2.3's `set_policy` did.

    A string becomes `Policy(string)` (so "mixed_float16" implies dynamic
    loss scaling), None the default float policy; a policy is set as is.

    Raises:
      ValueError: `policy` is none of those (or not a policy name).
    """
    if policy is None:
        policy = Policy(tf_keras.backend.floatx())
    elif isinstance(policy, str):
        policy = Policy(policy)
    elif not isinstance(policy, tf_keras.mixed_precision.Policy):
        raise ValueError(
            "set_policy takes a Policy, a policy name such as "
            f"'mixed_float16', or None; got {policy!r} of type "
            f"{type(policy).__name__}.")
    tf_keras.mixed_precision.set_global_policy(policy)


def global_policy() -> Policy:
    """tf_keras' global policy, as a `Policy` (see `policy.global_policy`)."""
    policy = tf_keras.mixed_precision.global_policy()
    if isinstance(policy, Policy):
        return policy
    return Policy(policy.name)
