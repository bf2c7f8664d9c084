"""The Keras 3 flavour's constructor arguments, read as their authors meant.

`KerasLossScaleOptimizer` has TensorFlow's documented signature, and takes
Keras 3 code's positionals too (`bind_positionals`: a number second is Keras
3's `initial_scale`, a bool TensorFlow's `dynamic`). Like Keras 3's class it
refuses the base-optimizer arguments that belong on the inner optimizer
(`check_base_arguments`). Both raise before anything is built.
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

from tf_lossscale import _checks, config_conversion
from tf_lossscale import settings as settings_lib

__all__ = [
    "bind_positionals",
    "check_base_arguments",
]


def check_base_arguments(kwargs: Dict[str, Any]) -> None:
    """Refuses Keras' base-optimizer arguments, as Keras' class does.

    At their defaults they are accepted (Keras' own configs may hold them);
    otherwise they belong on the inner optimizer.

    Raises:
      ValueError: a base-optimizer argument away from its default, or an
        argument no optimizer takes.
    """
    if "loss_scale" in kwargs:
        raise ValueError(
            "LossScaleOptimizer does not support `loss_scale` (TF 2.1-2.3's "
            f"spelling); got loss_scale={kwargs['loss_scale']!r}. Use "
            "tf_lossscale.experimental.LossScaleOptimizer(optimizer, "
            "loss_scale), or spell it here: 'dynamic' is dynamic=True, a "
            "number v is dynamic=False, initial_scale=v.")
    for name, default in config_conversion.KERAS_BASE_OPTIMIZER_DEFAULTS.items():
        if name in kwargs and kwargs.pop(name) != default:
            raise ValueError(
                f"LossScaleOptimizer does not support `{name}`. Instead, set "
                f"`{name}` on the `inner_optimizer`.")
    if kwargs:
        raise ValueError(
            "LossScaleOptimizer does not support arguments: "
            f"`{'`, `'.join(kwargs)}`. It takes inner_optimizer, "
            "dynamic, initial_scale, dynamic_growth_steps, name and the knobs "
            f"{sorted({**settings_lib.KNOB_DEFAULTS, **settings_lib.STOP_DEFAULTS})}.")


# The positional arguments after the inner optimizer, in TensorFlow's
# documented signature (which this class has) and in Keras 3's.
_TF_POSITIONALS = ("dynamic", "initial_scale", "dynamic_growth_steps", "name")
_KERAS3_POSITIONALS = ("initial_scale", "dynamic_growth_steps", "name")


def bind_positionals(args: Tuple[Any, ...], kwargs: Dict[str, Any]
                      ) -> Dict[str, Any]:
    """Names the positional arguments as the signature they were written for.

    TensorFlow's signature has `dynamic` (a bool) second; Keras 3's,
    `(inner_optimizer, initial_scale=2**15, dynamic_growth_steps=2000,
    name=None)`, has `initial_scale`. A number second can only be Keras 3's
    reading, so Keras 3 code `LossScaleOptimizer(opt, 1024)` means dynamic
    scaling from 1024, as in Keras 3; a bool second (or none) is
    TensorFlow's reading.

    Raises:
      NotANumberError: the second argument is neither a bool nor a number
        (a TypeError, as for TensorFlow's `dynamic`, and a ValueError, as
        for Keras 3's `initial_scale`).
      TypeError: too many positional arguments, or one given twice.
    """
    if not args:
        return kwargs
    first = args[0]
    keras3 = not isinstance(first, bool) and _checks.is_real(
        _checks.as_python_scalar(first))
    if not keras3 and not isinstance(first, bool):
        raise _checks.NotANumberError(
            '"dynamic" argument to LossScaleOptimizer.__init__ must be a '
            f"bool, but got: {first!r}. dynamic must be a bool (TensorFlow's "
            "signature), or else the second argument is Keras 3's "
            f"initial_scale, a number; got {first!r} of type "
            f"{type(first).__name__}, which is neither. To pass a legacy "
            "loss_scale such as 'dynamic' or 128, use tf_lossscale."
            "experimental.LossScaleOptimizer(optimizer, loss_scale).")
    names = _KERAS3_POSITIONALS if keras3 else _TF_POSITIONALS
    if len(args) > len(names):
        raise TypeError(
            f"LossScaleOptimizer takes at most {len(names) + 1} positional "
            f"arguments (inner_optimizer, {', '.join(names)}); got "
            f"{len(args) + 1}.")
    bound = dict(zip(names, args))
    twice = sorted(set(bound) & set(kwargs))
    if twice:
        raise TypeError(
            f"LossScaleOptimizer got multiple values for {twice}: the "
            f"positional arguments read as {names[:len(args)]}.")
    if keras3:
        # Keras 3 reads a `dynamic` keyword beside it; it is checked as ours.
        bound["dynamic"] = kwargs.pop("dynamic", True)
    return {**kwargs, **bound}
