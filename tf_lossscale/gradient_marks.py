"""`GradientMarks`: whether the gradients `apply_gradients` gets are scaled.

The two ways to use a LossScaleOptimizer (TensorFlow's documented
`get_scaled_loss` / `get_unscaled_gradients` flow, and Keras 3's
`scale_loss` flow) meet in `apply_gradients`; the marks left by the
scaling methods since the last apply tell them apart (API.md section 2).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import tensorflow as tf

__all__ = ["GradientMarks", "Taken"]


class _Place:
    """What happened at one place since its last apply."""

    def __init__(self) -> None:
        self.scaled_loss = False
        self.unscaled_inputs: Optional[List[Any]] = None
        self.unscaled_outputs: List[Any] = []
        self.verdict: Optional[tf.Tensor] = None
        # The loss and the scaled loss, if a scaling method saw them.
        self.loss: Optional[Tuple[Any, Any]] = None


class Taken(NamedTuple):
    """What `GradientMarks.take` found: whether the gradients are scaled
    (None: no mark, the flavour decides), and the verdict that
    `get_unscaled_gradients` computed if the gradients are its outputs,
    and the (loss, scaled loss) that `get_scaled_loss` / `scale_loss`
    last saw here (for the skip record: whether the loss was finite)."""

    scaled: Optional[bool]
    verdict: Optional[tf.Tensor] = None
    loss: Optional[Tuple[Any, Any]] = None


class GradientMarks:
    """Tells `apply_gradients` whether its gradients still carry the scale.

    The rule (API.md section 2), per place since the last apply:

    - `get_unscaled_gradients` ran: the gradients are unscaled, unless they
      are the very tensors that were passed to it (then they are scaled:
      it only looked at them);
    - else `get_scaled_loss` / `scale_loss` ran: scaled;
    - else: the flavour's default (`None` here). `ever_unscaled` tells the
      flavour whether `get_unscaled_gradients` ever ran, anywhere: code
      that accumulates its unscaled gradients and applies them in another
      `tf.function` (OpenNMT-tf, ALBERT pretraining) must not see them
      unscaled a second time.

    A place is a pair (graph, thread): the graph being traced (None when
    eager) and the Python thread, because `MirroredStrategy` runs each
    replica's step in a thread of its own. So the rule is exact inside
    `tf.function` (each trace keeps its own marks; the decision is traced
    into the graph) and under replicas.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ever_unscaled = False
        self._eager: Dict[int, _Place] = {}
        self._traced: "weakref.WeakKeyDictionary[tf.Graph, Dict[int, _Place]]" = (
            weakref.WeakKeyDictionary())

    def _places(self) -> Dict[int, _Place]:
        if tf.executing_eagerly():
            return self._eager
        return self._traced.setdefault(tf.compat.v1.get_default_graph(), {})

    def _here(self) -> _Place:
        return self._places().setdefault(threading.get_ident(), _Place())

    def scaled_loss(self, loss: Any = None, scaled: Any = None) -> None:
        """Records that the loss was scaled here (and the two values, which
        only a skipped step's record reads)."""
        with self._lock:
            place = self._here()
            place.scaled_loss = True
            if loss is not None:
                place.loss = (loss, scaled)

    def unscaled(self, inputs: Sequence[Any], outputs: Sequence[Any],
                 verdict: Optional[tf.Tensor]) -> None:
        """Records that `inputs` were unscaled here into `outputs`, which
        are all finite iff `verdict` (None: not computed)."""
        with self._lock:
            self.ever_unscaled = True
            place = self._here()
            first = place.unscaled_inputs is None
            place.unscaled_inputs = (place.unscaled_inputs or []) + [
                g for g in inputs if g is not None]
            place.unscaled_outputs = [g for g in outputs if g is not None]
            place.verdict = verdict if first else None

    def take(self, grads: Sequence[Any]) -> Taken:
        """Whether `grads` are scaled, and their known verdict; forgets the
        place."""
        with self._lock:
            place = self._places().pop(threading.get_ident(), None)
        if place is None:
            return Taken(None)
        present = [g for g in grads if g is not None]
        if place.unscaled_inputs is None:
            return Taken(True if place.scaled_loss else None, loss=place.loss)
        if present and all(_among(g, place.unscaled_inputs) for g in present):
            return Taken(True, loss=place.loss)  # It only looked at them.
        reused = place.verdict is not None and len(present) == len(
            place.unscaled_outputs) and all(
            g is x for g, x in zip(present, place.unscaled_outputs))
        return Taken(False, place.verdict if reused else None, place.loss)


def _among(tensor: Any, tensors: List[Any]) -> bool:
    return any(tensor is x for x in tensors)

