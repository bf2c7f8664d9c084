"""`GradientMarks`: what `apply_gradients` must know about its gradients.

The two ways to use a LossScaleOptimizer (TensorFlow's documented
`get_scaled_loss` / `get_unscaled_gradients` flow, and Keras 3's
`scale_loss` flow) meet in `apply_gradients`; the marks left by the
scaling methods since the last apply tell them apart (the rule is in
docs/differences.md). This is the one place that carries facts from a
scaling method to the apply that follows: whether the gradients are scaled,
the verdict `get_unscaled_gradients` computed, and which scaled gradient
and scale each of its quotients came from (`Taken.undivided`).
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
        # id(quotient) -> (quotient, the scaled gradient, the scale).
        self.quotients: Dict[int, Tuple[Any, Any, Any]] = {}
        # The loss and the scaled loss, if a scaling method saw them.
        self.loss: Optional[Tuple[Any, Any]] = None


# An identity changes no value: tf_keras sums the gradients of one replica
# with an IdentityN before the step sees them.
_IDENTITIES = ("Identity", "IdentityN")


class Taken(NamedTuple):
    """What `GradientMarks.take` found: whether the gradients are scaled
    (None: no mark, the flavour decides), the verdict that
    `get_unscaled_gradients` computed if the gradients are its outputs,
    what it divided (see `undivided`), and the (loss, scaled loss) that
    `get_scaled_loss` / `scale_loss` last saw here (for the skip record:
    whether the loss was finite)."""

    scaled: Optional[bool]
    verdict: Optional[tf.Tensor] = None
    quotients: Optional[Dict[int, Tuple[Any, Any, Any]]] = None
    loss: Optional[Tuple[Any, Any]] = None

    def undivided(self, grads: Sequence[Any]
                  ) -> Optional[Tuple[List[Any], Any]]:
        """`(scaled, scale)` if every present gradient is a quotient that
        `get_unscaled_gradients` made here with one scale (or an identity of
        one), else None.

        A step compiled whole by XLA then divides the scaled gradients
        again inside its apply branch (the same operation, so the same
        values), where the division fuses into the update, and the
        quotients made before, unused, are never written out.
        """
        if not self.quotients:
            return None
        found = []
        for grad in (g for g in grads if g is not None):
            origin = _through_identities(grad)
            entry = self.quotients.get(id(origin))
            if entry is None or entry[0] is not origin:
                return None
            found.append(entry)
        if not found or len({id(scale) for _, _, scale in found}) != 1:
            return None
        divided = iter(scaled for _, scaled, _ in found)
        return ([None if g is None else next(divided) for g in grads],
                found[0][2])

    def summed(self, before: Sequence[Any], after: Sequence[Any]) -> "Taken":
        """This `Taken` for the gradients `after` that summing `before`
        across replicas gave: the verdict is kept only where each of them
        is one of `before` passed on by identities (one replica: tf_keras
        sums with an `IdentityN`), as summing may overflow or take in
        another replica's NaN. In a graph the step then reads the
        gradients once for its verdict, not twice."""
        if self.verdict is None:
            return self
        if len(before) == len(after) and all(
                (a is None and b is None) or (
                    a is not None and _through_identities(a) is b)
                for b, a in zip(before, after)):
            return self
        return self._replace(verdict=None)


def _through_identities(grad: Any) -> Any:
    """`grad`, or the tensor that the identities it comes out of pass on."""
    while isinstance(grad, tf.Tensor) and not tf.executing_eagerly() and (
            grad.op.type in _IDENTITIES):
        grad = grad.op.inputs[grad.value_index if grad.op.type ==
                              "IdentityN" else 0]
    return grad


class GradientMarks:
    """Tells `apply_gradients` whether its gradients still carry the scale.

    The rule (docs/custom-loops.md, "Scaled or unscaled gradients?"), per
    place since the last apply:

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

    The flavour's default is decided when tracing, so a trace made before
    the first `get_unscaled_gradients` keeps the other answer;
    `traced_as_scaled` says whether there was one.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ever_unscaled = False
        self._eager: Dict[int, _Place] = {}
        self._traced: "weakref.WeakKeyDictionary[tf.Graph, Dict[int, _Place]]" = (
            weakref.WeakKeyDictionary())
        # Whether a trace took unmarked gradients as scaled by the
        # flavour's default (`defaulted_to_scaled`).
        self.traced_as_scaled = False

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
                 verdict: Optional[tf.Tensor], scale: Any = None) -> None:
        """Records that `inputs` were unscaled here into `outputs`, which
        are all finite iff `verdict` (None: not computed); with `scale`,
        which one each output is the quotient of (see `Taken.undivided`)."""
        with self._lock:
            self.ever_unscaled = True
            place = self._here()
            if scale is not None:
                place.quotients.update(
                    (id(o), (o, i, scale)) for i, o in zip(inputs, outputs)
                    if isinstance(o, tf.Tensor) and isinstance(i, tf.Tensor))
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
        return Taken(False, place.verdict if reused else None,
                     place.quotients, place.loss)

    def defaulted_to_scaled(self) -> None:
        """Records that an apply here took unmarked gradients as scaled by
        the flavour's default. Eagerly that is decided again every call;
        a trace keeps it for as long as its graph lives, which cannot be
        told (Keras' optimizers keep the graphs they applied in alive after
        the `tf.function` is gone), so it counts for good."""
        if not tf.executing_eagerly():
            self.traced_as_scaled = True


def _among(tensor: Any, tensors: List[Any]) -> bool:
    return any(tensor is x for x in tensors)

