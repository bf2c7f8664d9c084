"""The two Keras flavours a test body can run on, behind one adapter.

A behaviour checked on both Kerases is written once, in a `tests/_both_*.py`
module, as a test that takes the `flavour` fixture. Each side imports those
tests into a module of its own and so runs them in its own process:

- `tests/conftest.py` gives `flavour` as Keras 3's (`keras3()`), for the
  `tests/test_*.py` modules of the main run;
- `tests/tf_keras_cases/conftest.py` overrides it with tf_keras' (`tf_keras()`)
  for the `cases_*.py` modules, which `tests/_tf_keras_cases.py` runs in a
  process of their own with `TF_USE_LEGACY_KERAS=1` (tf_keras is only
  `tf.keras` when that is set before TensorFlow is imported).

What differs between the flavours lives here and nowhere in a shared body:
the Keras module, the framework's own `LossScaleOptimizer`, what our class is
called there, the config keys ours and the original write, how a variable is made,
and how a step hands gradients to `apply_gradients` (Keras 3's flow hands it
the gradients of the scaled loss; tf_keras' documented flow unscales them
first with `get_unscaled_gradients`).
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any, Callable, FrozenSet, List, Optional, Sequence

import numpy as np
import tensorflow as tf

import tf_lossscale

__all__ = ["Flavour", "keras3", "replica_values", "tf_keras"]

Edit = Callable[[List[Any]], List[Any]]


def _as_is(grads: List[Any]) -> List[Any]:
    return grads


@dataclasses.dataclass(frozen=True)
class Flavour:
    """What a test needs to know of one Keras flavour."""

    name: str
    keras: types.ModuleType  # `keras` or `tf_keras`.
    original: type  # The framework's own LossScaleOptimizer.
    class_name: str  # What `tf_lossscale.LossScaleOptimizer(...)` builds.
    # The words naming the inner optimizer a TypeError says it wants.
    optimizer_kind: str
    # What our get_config writes with default knobs, and what the
    # original's writes (Keras 3's own writes no `dynamic`).
    config_keys: FrozenSet[str]
    original_config_keys: FrozenSet[str]
    make_variable: Callable[[Any], Any]
    # Whether apply_gradients takes the gradients of the scaled loss (Keras
    # 3) or unscaled ones (tf_keras, after get_unscaled_gradients).
    applies_scaled: bool

    @property
    def optimizers(self) -> types.ModuleType:
        return self.keras.optimizers

    @property
    def optimizer_families(self) -> List[types.ModuleType]:
        """The modules of this Keras' optimizer families: Keras 3 has one;
        tf_keras has its current one and OptimizerV2 (`optimizers.legacy`),
        each with a flavour of its own."""
        legacy = getattr(self.keras.optimizers, "legacy", None)
        if self.name == "keras3" or legacy is None:
            return [self.keras.optimizers]
        return [self.keras.optimizers, legacy]

    def wrap(self, inner: Any, **kwargs: Any) -> Any:
        """Our LossScaleOptimizer around `inner`."""
        return tf_lossscale.LossScaleOptimizer(inner, **kwargs)

    def variable(self, value: Any) -> Any:
        return self.make_variable(value)

    def hand(self, opt: Any, grad: Any) -> Any:
        """What a user hands this flavour's `apply_gradients` for the true
        gradient `grad` (a tensor or `tf.IndexedSlices`): Keras 3 takes it
        scaled (times `opt.loss_scale`), tf_keras as it is (unmarked, as a
        loop that unscales by itself hands it over)."""
        if not self.applies_scaled:
            return grad
        scale = tf.cast(opt.loss_scale, grad.dtype)
        if isinstance(grad, tf.IndexedSlices):
            return tf.IndexedSlices(grad.values * scale, grad.indices,
                                    grad.dense_shape)
        return grad * scale

    @staticmethod
    def slots(opt: Any) -> List[Any]:
        """The inner optimizer's variables other than `iterations`."""
        return [v for v in opt.inner_optimizer.variables
                if "iteration" not in v.name]

    def to_apply(self, opt: Any, scaled_grads: Sequence[Any]) -> List[Any]:
        """What this flavour's flow hands `apply_gradients`, from the
        gradients of the scaled loss."""
        if self.applies_scaled:
            return list(scaled_grads)
        return list(opt.get_unscaled_gradients(list(scaled_grads)))

    def scaled_step(self, opt: Any, loss_fn: Callable[[], Any],
                    variables: Sequence[Any],
                    edit: Optional[Edit] = None) -> None:
        """One step of `loss_fn` as this flavour's users write it: the loss
        scaled, its gradients (`edit`ed, if given, just before they are
        handed over) applied."""
        with tf.GradientTape() as tape:
            loss = (opt.scale_loss(loss_fn()) if self.applies_scaled
                    else opt.get_scaled_loss(loss_fn()))
        grads = self.to_apply(opt, tape.gradient(loss, list(variables)))
        opt.apply_gradients(zip((edit or _as_is)(grads), variables))


def replica_values(variable: Any) -> List[np.ndarray]:
    """Every replica's value of a (Keras or TF, mirrored or not) variable."""
    inner = getattr(variable, "value", None)  # A Keras 3 variable's...
    if inner is None or callable(inner):  # ...not tf.Variable.value().
        inner = variable
    values = getattr(inner, "values", None)
    if values is None:
        return [np.asarray(tf.convert_to_tensor(inner))]
    return [np.asarray(v.numpy()) for v in values]


# The keys every LossScaleOptimizer's config has, ours and the originals'.
_KEYS = frozenset({"inner_optimizer", "initial_scale", "dynamic_growth_steps"})


def keras3() -> Flavour:
    """Keras 3's flavour (the main test process)."""
    import keras
    return Flavour(
        name="keras3", keras=keras,
        original=keras.mixed_precision.LossScaleOptimizer,
        class_name="KerasLossScaleOptimizer",
        optimizer_kind="keras.optimizers.Optimizer",
        config_keys=_KEYS | {"name", "dynamic"},
        original_config_keys=_KEYS | {"name"},  # Keras 3's: no `dynamic`.
        make_variable=keras.Variable, applies_scaled=True)


def tf_keras() -> Flavour:
    """tf_keras' flavour (only where TF_USE_LEGACY_KERAS=1 was set first)."""
    import tf_keras as module
    keys = _KEYS | {"dynamic"}  # No `name`, ours or tf_keras'.
    return Flavour(name="tf_keras", keras=module,
                   original=module.mixed_precision.LossScaleOptimizer,
                   class_name="TfKerasLossScaleOptimizer",
                   optimizer_kind="tf_keras optimizer", config_keys=keys,
                   original_config_keys=keys, make_variable=tf.Variable,
                   applies_scaled=False)
