"""In which order backpropagation reached a step's gradients, found at trace time.

A gradient tape makes the gradient ops of the layer nearest the loss first
and those of the input layer last, whatever the model's shape (branches,
residual adds, shared layers, several inputs and outputs, attention). In a
traced step (a `FuncGraph`) ops are numbered as they are created, so the
position of the op that made each gradient is its place in
backpropagation order. `ranks` reads it once, when the step is traced: no
op is added and an applied step pays nothing.

What counts as the op that made a gradient: the tensor's own op if the
tape made it (its name is under `gradient_tape/`, or `gradients/` for
`tf.gradients`); through an `AddN` (the tape summing the contributions of
a variable used in several places: a shared layer, a tied embedding), the
earliest contribution, where the gradient first reached the variable;
through `IdentityN`, the matching input; through a split of a
concatenation (tf_keras unscales all gradients as one vector), the
matching piece; through any other op (an unscaling division, a cast, an
identity, a clip), its first floating input; up to `_DEPTH` ops back. Eagerly there is no graph
to read: `ranks` returns None and the record keeps variable order.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import tensorflow as tf

__all__ = ["layer_of", "ranks"]

# How many non-tape ops back a gradient is followed.
_DEPTH = 10


def _made_by_tape(op: Any) -> bool:
    name = op.name
    return ("gradient_tape/" in name or name.startswith("gradients")
            or "/gradients/" in name)


def _position(tensor: Any, numbers: Dict[Any, int], depth: int,
              slot: Optional[int] = None) -> Optional[int]:
    """The creation number of the op that made `tensor` a gradient.

    `slot`: which piece of a concatenation `tensor` is, when it was split
    from one (tf_keras unscales its gradients as one concatenated vector:
    ConcatV2, a division, SplitV, then IdentityN).
    """
    op = tensor.op
    if op.type == "AddN":
        known = [p for p in (_position(x, numbers, depth) for x in op.inputs)
                 if p is not None]
        return min(known) if known else numbers.get(op)
    if _made_by_tape(op):
        return numbers.get(op)
    if depth <= 0:
        return None
    inputs = list(op.inputs)
    if op.type == "IdentityN":
        return _position(inputs[tensor.value_index], numbers, depth - 1,
                         slot)
    if op.type in ("Split", "SplitV"):
        value = inputs[1] if op.type == "Split" else inputs[0]
        return _position(value, numbers, depth - 1, tensor.value_index)
    if op.type == "ConcatV2" and slot is not None and slot < len(inputs) - 1:
        return _position(inputs[slot], numbers, depth - 1)
    for x in inputs:
        if x.dtype.is_floating:
            through = _position(x, numbers, depth - 1, slot)
            if through is not None:
                return through
    return None


def _values(grad: Any) -> Any:
    return grad.values if isinstance(grad, tf.IndexedSlices) else grad


def ranks(grads: Sequence[Any]) -> Optional[List[int]]:
    """Per present (not None) gradient, its place in backpropagation order
    (0: the first the tape made, nearest the loss); None when it cannot be
    known (eager tensors, gradients of different graphs, or none made by a
    gradient tape in this graph: the step's inputs, constants)."""
    present = [_values(g) for g in grads if g is not None]
    if not present or tf.executing_eagerly() or any(
            not isinstance(g, tf.Tensor) or not hasattr(g, "graph")
            for g in present):
        return None
    graphs = {id(g.graph): g.graph for g in present}
    if len(graphs) != 1:
        return None
    graph = next(iter(graphs.values()))
    numbers = {op: i for i, op in enumerate(graph.get_operations())}
    found = [_position(grad, numbers, _DEPTH) for grad in present]
    if all(p is None for p in found):
        return None  # No tape made them (a step's inputs, constants).
    positions = [numbers.get(g.op, 0) if p is None else p
                 for g, p in zip(present, found)]
    # Ties (one op making two gradients) keep variable order.
    by_place = sorted(range(len(present)),
                      key=lambda i: (positions[i], i))
    result = [0] * len(present)
    for rank, index in enumerate(by_place):
        result[index] = rank
    return result


def layer_of(name: str) -> str:
    """`net/l11` of a variable path `net/l11/kernel` (the path itself if it
    has a single part)."""
    head, _, _ = name.rpartition("/")
    return head or name
