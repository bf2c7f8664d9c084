"""`tf_lossscale.experimental.LossScaleOptimizer(optimizer, loss_scale)`.

The deprecated spelling of TF 2.1-2.4, kept so that old code runs. It holds
only the constructor: one `loss_scale` argument, converted by
`config_conversion.from_legacy_loss_scale` into the current class's
arguments. The classes that wrap a real optimizer are each flavour's
deprecated twin (`KerasExperimentalLossScaleOptimizer`, ...), defined beside
the flavour and registered here (`wraps=`): they subclass this class and
the flavour, so `get_config()` equals the current class's for the same
arguments. Use `tf_lossscale.LossScaleOptimizer` in new code.
"""

from __future__ import annotations

import warnings
from typing import Any, ClassVar, Dict, List, Optional, Tuple

import tensorflow as tf

from tf_lossscale import config_conversion, state_machine
from tf_lossscale import optimizer as optimizer_lib

__all__ = ["LossScaleOptimizer", "register_joined", "register_serializable"]


class LossScaleOptimizer(optimizer_lib.LossScaleOptimizer):
    """Deprecated: use `tf_lossscale.LossScaleOptimizer`.

    `LossScaleOptimizer(optimizer, loss_scale)`: `loss_scale` is "dynamic"
    (dynamic scaling with the defaults), an int or float >= 1 (a fixed
    scale), a `FixedLossScale` (the same), or a `DynamicLossScale` whose
    multiplier is 2 (its `initial_loss_scale` and `increment_period` become
    `initial_scale` and `dynamic_growth_steps`); TensorFlow's own
    `tf.compat.v1.mixed_precision` loss scales are accepted too.

    Raises:
      TypeError: `optimizer` is not an optimizer of a supported Keras, or is
        a LossScaleOptimizer; `loss_scale` is a `LossScale` of another class.
      ValueError: any other `loss_scale`, such as a `DynamicLossScale` with
        a multiplier other than 2.
    """

    _PICKS_FLAVOUR: ClassVar[bool] = True
    _INNER_ARGUMENT: ClassVar[str] = "optimizer"
    # Its original, TF 2.4's class, applied gradients as given: unscaled.
    _UNMARKED_GRADIENTS_ARE_SCALED: ClassVar[bool] = False

    def __init__(self, optimizer: Any, loss_scale: Any,
                 name: Optional[str] = None) -> None:
        args = config_conversion.from_legacy_loss_scale(loss_scale)
        warnings.warn(_replacement_message(args), DeprecationWarning,
                      stacklevel=2)
        # The flavour's constructor (next in the twin's MRO).
        super().__init__(optimizer, name=name, **args)

    def get_gradients(self, loss: Any, params: Any) -> List[Any]:
        """The unscaled gradients of `loss` for `params`, as TF 2.1-2.3's
        class gave them: the loss scaled, differentiated, the gradients
        unscaled.

        Symbolic, as it was: inside a `tf.function` or a TF1 graph
        (eagerly TensorFlow raises RuntimeError and asks for a
        `GradientTape`). The inner optimizer differentiates where it can
        (tf_keras' legacy optimizers, which also clip); otherwise
        `tf.gradients` does.

        Raises:
          ValueError: a parameter gets no gradient from `loss`.
        """
        scaled = self.get_scaled_loss(loss)
        inner_get = getattr(self.inner_optimizer, "get_gradients", None)
        if inner_get is not None:
            return self.get_unscaled_gradients(inner_get(scaled, params))
        params = tf.nest.flatten(params)
        grads = tf.gradients(scaled, params)
        for grad, param in zip(grads, params):
            if grad is None:
                raise ValueError(
                    f"Variable {param.name!r} has no gradient from the loss "
                    "passed to get_gradients: every parameter must be "
                    "reached by differentiable ops from it.")
        return self.get_unscaled_gradients(grads)

    @classmethod
    def _from_current_args(cls, inner_optimizer: Any,
                           args: Dict[str, Any]) -> "LossScaleOptimizer":
        args = dict(args)
        loss_scale = config_conversion.to_legacy_loss_scale(
            args.pop("dynamic"), args.pop("initial_scale"),
            args.pop("dynamic_growth_steps", None))
        return cls(inner_optimizer, loss_scale, **args)


def register_serializable(saving: Any, current: type, twin: type,
                          names: Tuple[str, str]) -> None:
    """Registers a flavour and its deprecated twin with a Keras' `saving`.

    Each saves under its own name (`names`: the current's, the twin's), and
    the twin's name loads as the current flavour: TF 2.4 and tf_keras load
    a saved experimental optimizer ("LossScaleOptimizerV1") as the
    non-experimental class, so a loaded model warns of no deprecation.
    `twin.from_config` itself still builds the twin, as TF 2.4's did.
    """
    saving.register_keras_serializable("tf_lossscale", names[0])(current)
    saving.register_keras_serializable("tf_lossscale", names[1])(twin)
    saving.get_custom_objects()[saving.get_registered_name(twin)] = current


def register_joined(saving: Any, joined: type, derived: type,
                    flavour: type) -> None:
    """Registers with a Keras' `saving` the class that joins a subclass of
    ours (`derived`, which names no flavour) with `flavour`.

    Saved under a name of its own (the subclass's module and name, and the
    flavour's), it loads as `derived`, which picks the flavour again from
    the inner optimizer's config. A process that loads it before building
    one needs `derived` in `custom_objects`, as for any custom class.
    """
    name = (f"{derived.__module__}.{derived.__qualname__}"
            f".{flavour.__qualname__}")
    registered = f"tf_lossscale.subclass>{name}"
    if registered not in saving.get_custom_objects():
        saving.register_keras_serializable("tf_lossscale.subclass",
                                           name)(joined)
    saving.get_custom_objects()[registered] = derived


def _replacement_message(args: Dict[str, Any]) -> str:
    """The deprecation message, with the equivalent current call."""
    spelled = []
    if not args["dynamic"]:
        spelled.append("dynamic=False")
    if args["initial_scale"] != state_machine.DEFAULT_INITIAL_SCALE or (
            not args["dynamic"]):
        spelled.append(f"initial_scale={args['initial_scale']!r}")
    growth = args["dynamic_growth_steps"]
    if growth is not None and growth != state_machine.DEFAULT_GROWTH_STEPS:
        spelled.append(f"dynamic_growth_steps={growth!r}")
    call = ", ".join(["optimizer"] + spelled)
    return (
        "tf_lossscale.experimental.LossScaleOptimizer is deprecated; use "
        f"tf_lossscale.LossScaleOptimizer({call}) instead, which is the same "
        "optimizer with the loss scale spelled as dynamic, initial_scale and "
        "dynamic_growth_steps.")
