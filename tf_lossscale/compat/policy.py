"""TF 2.1-2.3's mixed precision policy API, on Keras 3.

TF 2.1-2.3 spelt mixed precision as::

    policy = mixed_precision.Policy("mixed_float16", loss_scale="dynamic")
    mixed_precision.set_policy(policy)
    model.compile(optimizer="sgd", ...)  # wrapped with the policy's loss scale

A `Policy` here is a Keras 3 `DTypePolicy` (so layers use it as is) that
also holds a loss scale: "auto", the default, means dynamic scaling for
"mixed_float16" and none otherwise (`legacy_names.
default_policy_loss_scale`). What both Kerases' legacy policies share is
`LossScaleMixin`; the tf_keras one is `tf_keras_policy.Policy`. The shim's
compile hook (`compile_hook`) wraps the optimizer with the policy's loss
scale, as TF 2.3's compile did.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Union

import keras
import tensorflow as tf

from tf_lossscale import loss_scale as loss_scale_lib
from tf_lossscale.compat import legacy_names

__all__ = ["LossScaleMixin", "Policy", "global_policy", "set_policy",
           "tf_keras_is_tf_keras"]


def tf_keras_is_tf_keras() -> bool:
    """True when `tf.keras` is tf_keras (TF_USE_LEGACY_KERAS=1).

    Asked of `tf.keras.Model`: `tf.keras.mixed_precision` may be a copy of
    the module loaded under the name `tensorflow.keras.mixed_precision`.
    """
    return tf.keras.Model.__module__.startswith("tf_keras")


class LossScaleMixin:
    """The loss scale of a TF 2.1-2.3 policy, for either Keras' policy class.

    The class it is mixed into provides `name`, `compute_dtype`,
    `variable_dtype` and `get_config`.
    """

    name: str
    compute_dtype: Optional[str]
    variable_dtype: Optional[str]
    _loss_scale: Optional[loss_scale_lib.LossScale]
    _default_loss_scale: bool

    def _set_loss_scale(self, name: str, loss_scale: Any) -> None:
        """Stores `loss_scale` ("auto", "dynamic", a number, a LossScale, a
        serialized one, or None) as a LossScale or None.

        Raises:
          ValueError: `loss_scale` is none of those.
        """
        self._default_loss_scale = (isinstance(loss_scale, str)
                                    and loss_scale == "auto")
        if self._default_loss_scale:
            loss_scale = legacy_names.default_policy_loss_scale(name)
        elif isinstance(loss_scale, dict):
            loss_scale = loss_scale_lib.deserialize(loss_scale)
        self._loss_scale = loss_scale_lib.get(loss_scale)

    @property
    def loss_scale(self) -> Optional[loss_scale_lib.LossScale]:
        """The loss scale `model.compile` wraps the optimizer with, or None."""
        return self._loss_scale

    @property
    def should_cast_variables(self) -> bool:
        """True when variables are cast to the compute dtype in layers."""
        return self.compute_dtype != self.variable_dtype

    def _with_loss_scale(self, config: Dict[str, Any]) -> Dict[str, Any]:
        """`config` plus the loss scale, unless it is the name's default."""
        if not self._default_loss_scale:
            config["loss_scale"] = (
                None if self._loss_scale is None
                else loss_scale_lib.serialize(self._loss_scale))
        return config

    def __repr__(self) -> str:
        return f'<Policy "{self.name}", loss_scale={self._loss_scale}>'


class Policy(LossScaleMixin, keras.DTypePolicy):
    """A Keras 3 dtype policy with a loss scale, as in TF 2.1-2.3.

    Examples:
        >>> policy = Policy("mixed_float16")
        >>> policy.compute_dtype, policy.variable_dtype
        ('float16', 'float32')
        >>> type(policy.loss_scale).__name__
        'DynamicLossScale'
        >>> print(Policy("float32").loss_scale)
        None
    """

    def __init__(self, name: str, loss_scale: Any = "auto") -> None:
        """Creates the policy.

        Args:
          name: a Keras policy name: "mixed_float16", "mixed_bfloat16" or a
            float dtype such as "float32".
          loss_scale: "auto" (dynamic for "mixed_float16", else None),
            "dynamic", an int or float >= 1, a `tf_lossscale.LossScale`, a
            serialized one of those, or None for no loss scaling.

        Raises:
          TypeError, ValueError: `name` is not a policy name (from Keras).
          ValueError: `loss_scale` is none of the accepted values.
        """
        super().__init__(name)
        self._set_loss_scale(name, loss_scale)

    def get_config(self) -> Dict[str, Any]:
        return self._with_loss_scale(super().get_config())


def set_policy(policy: Union[Policy, keras.DTypePolicy, str, None]) -> None:
    """Sets the global Keras 3 policy, as TF 2.1-2.3's `set_policy` did.

    A string becomes `Policy(string)` (so "mixed_float16" implies dynamic
    loss scaling), None the default float policy; a policy is set as is.

    Raises:
      ValueError: `policy` is none of those (or not a policy name).
      RuntimeError: `tf.keras` is tf_keras (TF_USE_LEGACY_KERAS=1), whose
        layers would not see a Keras 3 policy; the shim binds
        `tf_keras_policy.set_policy` there instead.
    """
    if tf_keras_is_tf_keras():
        raise RuntimeError(
            "tf_lossscale.compat.set_policy sets the Keras 3 policy, but "
            "tf.keras is tf_keras here (TF_USE_LEGACY_KERAS=1), whose layers "
            "would not see it. Use tf_lossscale.compat.tf_keras_policy."
            "set_policy (what the shim binds to tf.keras.mixed_precision."
            "experimental.set_policy there), or tf_keras.mixed_precision."
            "set_global_policy.")
    if policy is None:
        policy = Policy(keras.config.floatx())
    elif isinstance(policy, str):
        policy = Policy(policy)
    elif not isinstance(policy, keras.DTypePolicy):
        raise ValueError(
            "set_policy takes a Policy, a policy name such as "
            f"'mixed_float16', or None; got {policy!r} of type "
            f"{type(policy).__name__}.")
    keras.config.set_dtype_policy(policy)


def global_policy() -> Policy:
    """The global Keras 3 policy, as a `Policy`.

    A policy set through Keras 3 directly is returned as a new
    `Policy` of the same name, with that name's default loss scale.
    """
    policy = keras.config.dtype_policy()
    if isinstance(policy, Policy):
        return policy
    return Policy(policy.name)
