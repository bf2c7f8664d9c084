"""What the legacy tf_keras flavour serves from its inner OptimizerV2.

`OptimizerV2Delegation` is a base of `tf_keras_legacy_optimizer`'s
flavour (first, so its names come right after the flavour's own): the
OptimizerV2 API that tf_keras' wrapper of the legacy family hands to its
inner optimizer, handed on the same way:

- the hyperparameters: a name the wrapper does not have itself and the
  inner optimizer keeps in its `_hyper` (`lr`, `learning_rate`, ...) reads
  and writes there, and so do the clipping attributes and the plain
  attributes of `ATTRIBUTES` (docs/differences.md: hyperparameters read
  through, which tf_keras' wrapper does for `_hyper` names only);
- its state: `iterations`, `weights`, `get_weights`, `set_weights`,
  `variables()` and the slots (an h5 file keeps no loss scale, as with
  tf_keras' wrapper);
- OptimizerV2's protocol with Keras and checkpoints (h5 loading creates
  the weights, a checkpoint restore creates the slots) and its gradient
  aggregation.

The class holds no state of its own: every name reads the flavour's
`inner_optimizer`.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Tuple

import tensorflow as tf

from tf_lossscale import _tf_private
from tf_lossscale.inner_attribute import InnerAttribute

__all__ = [
    "ATTRIBUTES",
    "GradsAndVars",
    "OptimizerV2Delegation",
]

# Settings of the built-in legacy optimizers that they keep as plain
# attributes, not in `_hyper`; they read and write through too (docs/differences.md
# section 0: hyperparameters of the inner optimizer read through, which
# tf_keras' wrapper does for `_hyper` names only).
ATTRIBUTES = ("amsgrad", "centered", "epsilon", "nesterov")

GradsAndVars = Iterable[Tuple[Any, Any]]


class OptimizerV2Delegation:
    """OptimizerV2's API, served by the inner optimizer (see the module)."""

    inner_optimizer: Any  # The flavour's.

    # Hyperparameters, as tf_keras' wrapper delegates them: a name the
    # wrapper does not have itself and the inner optimizer keeps in its
    # `_hyper` reads (`_get_hyper`) and writes (`_set_hyper`) there.

    def _inner_hyper(self) -> Dict[str, Any]:
        inner = self.__dict__.get("inner_optimizer")
        if inner is None:
            return {}
        return _tf_private.tf_keras_hyperparameters(inner)

    def __getattr__(self, name: str) -> Any:
        # Reached only when the wrapper has no attribute `name`.
        if not name.startswith("__") and name in self._inner_hyper():
            return _tf_private.tf_keras_get_hyper(self.inner_optimizer, name)
        raise AttributeError(
            f"'{type(self).__name__}' object has no attribute '{name}'")

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "lr":
            name = "learning_rate"
        if (name in self._inner_hyper() and not hasattr(type(self), name)
                and name not in self.__dict__):
            _tf_private.tf_keras_set_hyper(self.inner_optimizer, name, value)
            return
        # Not the bases' `__setattr__`: OptimizerV2's and tf_keras' wrapper's
        # apply their own hyperparameter rules (the one above is theirs) to
        # state this wrapper does not have.
        object.__setattr__(self, name, value)

    def __dir__(self) -> List[str]:
        names = set(super().__dir__()) | set(self._inner_hyper())
        return sorted(names)

    def _set_hyper(self, name: str, value: Any) -> None:
        _tf_private.tf_keras_set_hyper(self.inner_optimizer, name, value)

    def _get_hyper(self, name: str, dtype: Any = None) -> Any:
        return _tf_private.tf_keras_get_hyper(self.inner_optimizer, name,
                                              dtype)

    @property
    def learning_rate(self) -> Any:
        """The inner optimizer's learning rate (a variable or a schedule)."""
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, value: Any) -> None:
        self.inner_optimizer.learning_rate = value

    @property
    def lr(self) -> Any:
        """tf_keras' old name of `learning_rate`."""
        return self.inner_optimizer.learning_rate

    @lr.setter
    def lr(self, value: Any) -> None:
        self.inner_optimizer.lr = value

    @property
    def clipnorm(self) -> Optional[float]:
        """The inner optimizer's `clipnorm` (it clips what it applies)."""
        return self.inner_optimizer.clipnorm

    @clipnorm.setter
    def clipnorm(self, value: Optional[float]) -> None:
        self.inner_optimizer.clipnorm = value

    @property
    def global_clipnorm(self) -> Optional[float]:
        """The inner optimizer's `global_clipnorm`."""
        return self.inner_optimizer.global_clipnorm

    @global_clipnorm.setter
    def global_clipnorm(self, value: Optional[float]) -> None:
        self.inner_optimizer.global_clipnorm = value

    @property
    def clipvalue(self) -> Optional[float]:
        """The inner optimizer's `clipvalue`."""
        return self.inner_optimizer.clipvalue

    @clipvalue.setter
    def clipvalue(self, value: Optional[float]) -> None:
        self.inner_optimizer.clipvalue = value

    # OptimizerV2's state, served by the inner optimizer.

    @property
    def iterations(self) -> Any:
        """The inner optimizer's step count; advances on skipped steps too."""
        return self.inner_optimizer.iterations

    @iterations.setter
    def iterations(self, variable: Any) -> None:
        self.inner_optimizer.iterations = variable

    @property
    def weights(self) -> List[tf.Variable]:
        """The inner optimizer's weights (the loss scale is not one)."""
        return self.inner_optimizer.weights

    def get_weights(self) -> List[Any]:
        """The values of the inner optimizer's weights."""
        return self.inner_optimizer.get_weights()

    def set_weights(self, weights: List[Any]) -> None:
        """Sets the inner optimizer's weights (as h5 loading does)."""
        self.inner_optimizer.set_weights(weights)

    def variables(self) -> List[tf.Variable]:
        """The inner optimizer's variables, in the order it created them."""
        return self.inner_optimizer.variables()

    def get_slot_names(self) -> List[str]:
        """The inner optimizer's slot names."""
        return self.inner_optimizer.get_slot_names()

    def get_slot(self, var: Any, slot_name: str) -> Any:
        """The inner optimizer's slot `slot_name` for `var`."""
        return self.inner_optimizer.get_slot(var, slot_name)

    def add_slot(self, var: Any, slot_name: str, initializer: Any = "zeros",
                 shape: Any = None) -> Any:
        """Adds a slot to the inner optimizer."""
        return self.inner_optimizer.add_slot(var, slot_name, initializer,
                                             shape=shape)

    # OptimizerV2's protocol with Keras and checkpoints (no public
    # spelling), delegated as tf_keras' wrapper delegates it, through the
    # wall's accessors: h5 loading creates the weights, a checkpoint
    # restore creates the slots.

    def _create_all_weights(self, var_list: List[Any]) -> None:
        _tf_private.tf_keras_create_all_weights(self.inner_optimizer, var_list)

    def _create_or_restore_slot_variable(self, slot_variable_position: Any,
                                         slot_name: str,
                                         variable: Any) -> Any:
        return _tf_private.tf_keras_create_or_restore_slot_variable(
            self.inner_optimizer, slot_variable_position, slot_name, variable)

    def _restore_slot_variable(self, slot_name: str, variable: Any,
                               slot_variable: Any) -> Any:
        return _tf_private.tf_keras_restore_slot_variable(
            self.inner_optimizer, slot_name, variable, slot_variable)

    def _aggregate_gradients(self, grads_and_vars: GradsAndVars
                             ) -> List[Tuple[Any, Any]]:
        return _tf_private.tf_keras_sum_gradients(self.inner_optimizer,
                                                  grads_and_vars)



for _name in ATTRIBUTES:
    setattr(OptimizerV2Delegation, _name, InnerAttribute(_name))
del _name
