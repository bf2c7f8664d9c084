"""TF 2.1-2.3's mixed precision policy API, on Keras 3.

TF 2.1-2.3 spelt mixed precision as::

    policy = mixed_precision.Policy("mixed_float16", loss_scale="dynamic")
    mixed_precision.set_policy(policy)
    model.compile(optimizer="sgd", ...)  # wrapped with the policy's loss scale

A `Policy` here is a Keras 3 `DTypePolicy` (so layers use it as is) that
also holds a loss scale: "auto", the default, means dynamic scaling for
"mixed_float16" and none otherwise (`legacy_names.
default_policy_loss_scale`). Keras 3's own `compile` wraps the optimizer in
its `LossScaleOptimizer` whenever the policy is named "mixed_float16", with
no way to pass a loss scale. `optimizer_for_compile` is what TF 2.3's compile
did instead; the shim (`shim.install`) calls it from `keras.Model.compile`.
"""

from __future__ import annotations

import warnings
from typing import Any, Optional, Union

import keras
import tensorflow as tf

from tf_lossscale.compat import legacy_names
from tf_lossscale import experimental
from tf_lossscale import loss_scale as loss_scale_lib

__all__ = ["Policy", "global_policy", "optimizer_for_compile", "set_policy"]


class Policy(keras.DTypePolicy):
    """A dtype policy with a loss scale, as in TF 2.1-2.3.

    Example:

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

    def get_config(self) -> dict:
        config = super().get_config()
        if not self._default_loss_scale:
            config["loss_scale"] = (
                None if self._loss_scale is None
                else loss_scale_lib.serialize(self._loss_scale))
        return config

    def __repr__(self) -> str:
        return f'<Policy "{self.name}", loss_scale={self._loss_scale}>'


def set_policy(policy: Union[Policy, keras.DTypePolicy, str, None]) -> None:
    """Sets the global policy, as TF 2.1-2.3's `set_policy` did.

    A string becomes `Policy(string)` (so "mixed_float16" implies dynamic
    loss scaling), None the default float policy; a policy is set as is.

    Raises:
      ValueError: `policy` is none of those (or not a policy name).
      RuntimeError: `tf.keras` is tf_keras (TF_USE_LEGACY_KERAS=1), whose
        layers would not see a Keras 3 policy.
    """
    if tf.keras.mixed_precision.__name__.startswith("tf_keras"):
        raise RuntimeError(
            "tf_lossscale.compat's set_policy sets the Keras 3 policy, but "
            "tf.keras is tf_keras here (TF_USE_LEGACY_KERAS=1), whose layers "
            "would not see it. Use tf_keras.mixed_precision.set_global_policy"
            "(name) and wrap the optimizer in tf_lossscale.LossScaleOptimizer "
            "yourself.")
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
    """The global policy, as a `Policy`.

    A policy set through Keras 3 directly is returned as a new
    `Policy` of the same name, with that name's default loss scale.
    """
    policy = keras.config.dtype_policy()
    if isinstance(policy, Policy):
        return policy
    return Policy(policy.name)


def optimizer_for_compile(policy: keras.DTypePolicy, optimizer: Any) -> Any:
    """The optimizer TF 2.3's `model.compile` used under `policy`.

    Under a `Policy` with a loss scale, an optimizer that is not already a
    loss-scale optimizer is wrapped in the experimental
    `LossScaleOptimizer(optimizer, policy.loss_scale)`, as TF 2.3 did;
    anything else is returned unchanged. Keras 3's compile then leaves the
    wrapped optimizer alone: it is an instance of Keras'
    `LossScaleOptimizer`.
    """
    if (not isinstance(policy, Policy) or policy.loss_scale is None
            or optimizer is None):
        return optimizer
    optimizer = keras.optimizers.get(optimizer)
    if isinstance(optimizer, keras.mixed_precision.LossScaleOptimizer):
        return optimizer
    with warnings.catch_warnings():
        # TF 2.3's compile chose this class itself; the user did not.
        warnings.simplefilter("ignore", DeprecationWarning)
        return experimental.LossScaleOptimizer(optimizer, policy.loss_scale)
