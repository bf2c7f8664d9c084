"""The opt-in deep look: which op made the first NaN or Inf of a step.

`first_nonfinite_op(loss_fn, variables, scale)` replays one step's forward
and backward pass, the loss multiplied by `scale` (the scale the skipped
step used: `opt.last_skip.scale`), inside a `tf.function` traced with
TensorFlow's numeric checks on (`tf.debugging.enable_check_numerics`,
switched off again before it returns), and reads the first op whose output
held a NaN or Inf from the check's error. It applies nothing: variables,
optimizer slots, the loss scale and `iterations` stay as they were. It
costs nothing unless called (call it after a skipped step, e.g. when
`opt.last_skip.step` is the step just run and its streak is 1). Stateful
random ops in `loss_fn` (dropout) draw again, so a fault that depends on
the draw may not come back.

Custom loops only for now: `fit` does not hand its batches to callbacks.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Optional, Sequence

import tensorflow as tf

__all__ = ["NonFiniteOp", "first_nonfinite_op"]


@dataclasses.dataclass(frozen=True)
class NonFiniteOp:
    """The first op whose output held a NaN or Inf in the replay.

    Attributes:
      op: the op's name in the replayed graph (its name scopes hold the
        layer: `net/l3/MatMul`, or `gradient_tape/...` in the backward
        pass).
      op_type: the op's type (`MatMul`, `Cast`, `Log`, ...).
      backward: whether the gradient tape made it (the backward pass).
      input: the name of the op's first input, or None.
      dtype: its output's dtype, e.g. "float16".
    """

    op: str
    op_type: str
    backward: bool
    input: Optional[str]
    dtype: str

    def describe(self) -> str:
        """`first NaN/Inf: Cast (float16) gradient_tape/net/Cast_1/Cast in
        the backward pass, fed by gradient_tape/net/out/MatMul/MatMul`."""
        fed = f", fed by {self.input}" if self.input else ""
        where = "backward" if self.backward else "forward"
        return (f"first NaN/Inf: {self.op_type} ({self.dtype}) {self.op} in "
                f"the {where} pass{fed}")

    def __str__(self) -> str:
        return self.describe()


_NODE = re.compile(r"Detected at node '?([^\s']+?)/CheckNumerics(?:V2)?'? ")
_TYPE = re.compile(r'graph op "([^"]+)"')
_DTYPE = re.compile(r"dtype: <dtype: '([^']+)'>")
_INPUT = re.compile(r'Input tensor: Tensor\("([^":]+)')


def parse(message: str) -> Optional[NonFiniteOp]:
    """The op a numeric check's error message names, or None."""
    node, kind = _NODE.search(message), _TYPE.search(message)
    if node is None or kind is None:
        return None
    dtype, feed = _DTYPE.search(message), _INPUT.search(message)
    name = node.group(1)
    return NonFiniteOp(
        op=name, op_type=kind.group(1),
        backward=name.startswith("gradient_tape/")
        or "/gradient_tape/" in name,
        input=feed.group(1) if feed else None,
        dtype=dtype.group(1) if dtype else "?")


def first_nonfinite_op(loss_fn: Callable[[], Any],
                       variables: Sequence[Any], scale: float
                       ) -> Optional[NonFiniteOp]:
    """Replays `loss_fn` and its gradients at `scale`; the first op that
    made a NaN or Inf, or None if every value was finite.

    Args:
      loss_fn: computes the step's (unscaled) loss from its batch, e.g.
        `lambda: loss_object(y, model(x, training=True))`.
      variables: the variables the step differentiates.
      scale: the loss scale of the skipped step (`opt.last_skip.scale`).
    """

    def replay() -> Any:
        with tf.GradientTape() as tape:
            loss = tf.convert_to_tensor(loss_fn())
            scaled = loss * tf.cast(scale, loss.dtype)
        return tape.gradient(scaled, list(variables))

    tf.debugging.enable_check_numerics()
    try:
        tf.function(replay, autograph=False)()
    except tf.errors.InvalidArgumentError as error:
        return parse(error.message)
    finally:
        tf.debugging.disable_check_numerics()
    return None
