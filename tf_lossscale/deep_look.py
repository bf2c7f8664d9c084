"""The opt-in deep look: which op made the first NaN or Inf of a step.

`first_nonfinite_op(loss_fn, variables, scale)` replays one step's forward
and backward pass, the loss multiplied by `scale` (the scale the skipped
step used: `opt.last_skip.scale`), inside a `tf.function` traced with
TensorFlow's numeric checks on (`tf.debugging.enable_check_numerics`,
switched off again before it returns), and reads the first op whose output
held a NaN or Inf from the check's error. It applies nothing: variables,
optimizer slots, the loss scale and `iterations` stay as they were. It
costs nothing unless called (call it after a skipped step, e.g. when
`opt.last_skip.step` is the step just run and its streak is 1). Every
variable the replay writes (a Dropout's seed generator, a BatchNormalization's
moving statistics, a compiled loss's metrics) is put back as it was, so
the random state stays as if it had not run; the replay's own draws may
differ from the step's, so a fault that depends on the draw may not come
back. An op of the backward pass found at a scale above 1 is replayed once
more at scale 1: finite there, the scale made the NaN or Inf (float16
overflow, which the back-off cures); not, it is a real one (the gradient
of a sqrt or a division at 0). The op's own kind cannot tell them: the
gradient of `sqrt` at 0 is +Inf as surely as an overflowing cast is.

Under a `tf.distribute` strategy of several replicas (`strategy=`) the
replay runs as the step ran, through `strategy.run` in a replica context
(each replica's loss divided by their number, metrics and a
BatchNormalization's statistics per replica), every replica on the one
batch given; a variable is read and put back replica by replica.

For `fit`, `LossScaleMonitor(deep_look=True)` is the switch: while that
`fit` runs, `KeptBatch` has the model's train step hand its batch back
with its logs (a reference, no copy, no op), and on the first skipped
step of a run the monitor replays that batch (`replay_batch`) and prints
the op. Under `MirroredStrategy` every replica hands back its own batch
(`KeptBatch.batches`, by replica id), and the monitor replays the batch of
the replica the skip record names.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from typing import Any, Callable, Dict, Optional, Sequence

import tensorflow as tf

from tf_lossscale import _tf_private

__all__ = ["KeptBatch", "NonFiniteOp", "first_nonfinite_op", "replay_batch",
           "unkept_reason"]

# The key under which the wrapped train step hands its batches back. It
# sorts after any metric's name: tf_keras makes the step counter's
# increment wait for the first of the step's outputs in key order, which
# must stay a value the step computed, not the batch it was given.
_BATCH_KEY = "~tf_lossscale_deep_look_batches"
# The scope MirroredStrategy puts a replica's ops in (none for replica 0).
_REPLICA_SCOPE = re.compile(r"^replica_\d+/")


@dataclasses.dataclass(frozen=True)
class NonFiniteOp:
    """The first op whose output held a NaN or Inf in the replay.

    Attributes:
      op: the op's name in the replayed graph (its name scopes hold the
        layer: `net/l3/MatMul`, or `gradient_tape/...` in the backward
        pass).
      op_type: the op's type (`MatMul`, `Cast`, `Log`, ...).
      backward: whether the gradient tape made it (the backward pass).
      input: the name of the op's first input ("the input batch" when it
        is the batch handed to the replay), or None.
      dtype: its output's dtype, e.g. "float16".
      layer: the model's layer whose name scope holds the op (or, for an
        op between layers, its input's), when the replay knew the model
        (`replay_batch`); else None.
      kind: what its output held: "Inf", "NaN" or "NaN and Inf" (the
        check counts -Inf, +Inf and NaN apart), "NaN/Inf" if not known.
      overflow: for an op of the backward pass replayed at a scale above
        1, whether the same replay at scale 1 was finite everywhere: True,
        the scale made the non-finite values (float16 overflow, which the
        back-off cures); False, they come at scale 1 too (a real NaN or
        Inf: the gradient of a sqrt or division at 0, which no scale
        cures). None where not replayed (the forward pass, which the scale
        does not reach, or a scale of 1 or less).
    """

    op: str
    op_type: str
    backward: bool
    input: Optional[str]
    dtype: str
    layer: Optional[str] = None
    kind: str = "NaN/Inf"
    overflow: Optional[bool] = None

    def describe(self) -> str:
        """`first Inf: Cast (float16) gradient_tape/net/Cast_1/Cast in
        the backward pass, fed by gradient_tape/net/out/MatMul/MatMul;
        finite at scale 1: float16 overflow` (with `, layer out` after the
        pass when the layer is known)."""
        fed = f", fed by {self.input}" if self.input else ""
        where = "backward" if self.backward else "forward"
        layer = f", layer {self.layer}" if self.layer else ""
        return (f"first {self.kind}: {self.op_type} ({self.dtype}) {self.op} "
                f"in the {where} pass{layer}{fed}{_OVERFLOW[self.overflow]}")

    def __str__(self) -> str:
        return self.describe()


# What `describe` says of `overflow`.
_OVERFLOW = {None: "", True: "; finite at scale 1: float16 overflow",
             False: "; non-finite at scale 1 too: not overflow"}

_NODE = re.compile(r"Detected at node '?([^\s']+?)/CheckNumerics(?:V2)?'? ")
_TYPE = re.compile(r'graph op "([^"]+)"')
_DTYPE = re.compile(r"dtype: <dtype: '([^']+)'>")
_INPUT = re.compile(r'Input tensor: Tensor\("([^":]+)')
_HAD = re.compile(r"Tensor had ([-+A-Za-z ]+) values")


def _kind(message: str) -> str:
    """"Inf", "NaN" or "NaN and Inf" from the check's `Tensor had -Inf
    and +Inf values`, or "NaN/Inf"."""
    had = _HAD.search(message)
    text = had.group(1) if had else ""
    found = [k for k in ("NaN", "Inf") if k in text]
    return " and ".join(found) or "NaN/Inf"


def parse(message: str) -> Optional[NonFiniteOp]:
    """The op a numeric check's error message names, or None; without the
    scope MirroredStrategy puts a replica's ops in (`replica_1/`), so a
    replica's op has the name the model gives it."""
    node, kind = _NODE.search(message), _TYPE.search(message)
    if node is None or kind is None:
        return None
    dtype, feed = _DTYPE.search(message), _INPUT.search(message)
    name = _REPLICA_SCOPE.sub("", node.group(1))
    return NonFiniteOp(
        op=name, op_type=kind.group(1),
        backward=name.startswith("gradient_tape/")
        or "/gradient_tape/" in name,
        input=_REPLICA_SCOPE.sub("", feed.group(1)) if feed else None,
        dtype=dtype.group(1) if dtype else "?", kind=_kind(message))


def _replicas(strategy: Any) -> int:
    return 1 if strategy is None else int(strategy.num_replicas_in_sync)


def first_nonfinite_op(loss_fn: Callable[..., Any],
                       variables: Sequence[Any], scale: float,
                       inputs: Any = None,
                       strategy: Optional[tf.distribute.Strategy] = None
                       ) -> Optional[NonFiniteOp]:
    """Replays `loss_fn` and its gradients at `scale`; the first op that
    made a NaN or Inf, or None if every value was finite. An op of the
    backward pass at a scale above 1 is replayed once more at scale 1,
    which says whether the scale made it (`NonFiniteOp.overflow`).

    Args:
      loss_fn: computes the step's (unscaled) loss from its batch, e.g.
        `lambda: loss_object(y, model(x, training=True))`.
      variables: the variables the step differentiates.
      scale: the loss scale of the skipped step (`opt.last_skip.scale`).
      inputs: None, or a structure of tensors (the batch) handed to
        `loss_fn` as its one argument and fed to the replay as its inputs:
        a NaN or Inf in the batch is then found at the first op that reads
        it (not at a constant holding it).
      strategy: None, or the `tf.distribute` strategy the step ran under
        (of several replicas): the replay then runs through
        `strategy.run`, on every replica, each on `inputs`, as one replica
        of the step ran (its loss divided by the number of replicas, its
        own metrics and moving statistics). Give the batch of the replica
        whose step to replay.
    """
    found = _replay(loss_fn, variables, scale, inputs, strategy)
    if found is None or not found.backward or not scale > 1.0:
        return found
    again = _replay(loss_fn, variables, 1.0, inputs, strategy)
    return dataclasses.replace(found, overflow=again is None)


def _replay(loss_fn: Callable[..., Any], variables: Sequence[Any],
            scale: float, inputs: Any, strategy: Any
            ) -> Optional[NonFiniteOp]:
    """`first_nonfinite_op` at one scale."""

    def on_replica(*batch: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.convert_to_tensor(loss_fn(*batch))
            scaled = loss * tf.cast(scale, loss.dtype)
        return tape.gradient(scaled, list(variables))

    several = _replicas(strategy) > 1

    def replay(*batch: Any) -> Any:
        if strategy is None or not several:
            return on_replica(*batch)
        return strategy.experimental_local_results(
            strategy.run(on_replica, args=batch))

    batch = () if inputs is None else (tf.nest.map_structure(
        tf.convert_to_tensor, inputs),)
    # The checks are put into the graph as it is traced; the variables
    # are read and put back with them off (a metric may hold a NaN).
    tf.debugging.enable_check_numerics()
    try:
        traced = tf.function(replay, autograph=False).get_concrete_function(
            *batch)
    finally:
        tf.debugging.disable_check_numerics()
    fed = {t.op.name for t in traced.inputs if t.dtype != tf.resource}
    # What the replay reads or writes; written ones are put back. Under a
    # strategy these are each replica's own copies (what `strategy.run`
    # reads and writes), each put back as it was.
    touched = list(traced.variables)
    kept = [v.numpy() for v in touched]
    try:
        traced(*batch)
    except tf.errors.InvalidArgumentError as error:
        found = parse(error.message)
        if found is not None and found.input in fed:
            found = dataclasses.replace(found, input="the input batch")
        return found
    finally:
        for variable, value in zip(touched, kept):
            variable.assign(value)
    return None


def _is_tf_keras(model: Any) -> bool:
    module = sys.modules.get("tf_keras")
    return module is not None and isinstance(model, module.Model)


def _layer_of_op(model: Any, found: NonFiniteOp) -> Optional[str]:
    """The first name scope of `found`'s op (or else its input's) that is
    one of `model`'s layers (Keras 3's `out_1` is `out`)."""
    names = {layer.name for layer in getattr(model, "layers", [])}
    for op in (found.op, found.input or ""):
        for part in op.split("/"):
            # Keras 3 makes a scope unique with a suffix: `out_1`.
            for name in (part, re.sub(r"_\d+$", "", part)):
                if name in names:
                    return name
    return None


def replay_batch(model: Any, batch: Any, scale: float
                 ) -> Optional[NonFiniteOp]:
    """`first_nonfinite_op` for the compiled loss of a Keras 3 or tf_keras
    `model` on a batch of `fit` (`(x, y)` or `(x, y, sample_weight)`), at
    `scale`; the op's `layer` filled in. Under a strategy of several
    replicas (the model's `distribute_strategy`) `batch` is one replica's,
    replayed as that replica's step ran."""
    if _is_tf_keras(model):
        import tf_keras as keras_module
    else:
        import keras as keras_module

    def loss_fn(data: Any) -> Any:
        x, y, weight = keras_module.utils.unpack_x_y_sample_weight(data)
        y_pred = model(x, training=True)
        return _tf_private.keras_model_loss(model, x, y, y_pred, weight)

    strategy = getattr(model, "distribute_strategy", None)
    found = first_nonfinite_op(
        loss_fn, model.trainable_variables, scale, inputs=batch,
        strategy=strategy if _replicas(strategy) > 1 else None)
    if found is None:
        return None
    return dataclasses.replace(found, layer=_layer_of_op(model, found))


def unkept_reason(model: Any) -> Optional[str]:
    """Why `KeptBatch` cannot keep `model`'s batches in `fit`, or None.

    It can on one replica and under `MirroredStrategy`, whose replicas
    run in one process, each step's in turn, so that all can hand back
    one dict of every replica's batch. Not under other strategies of
    several replicas (several workers: the record's replica may be
    another worker's), nor with tf_keras' `jit_compile=True` under
    several replicas, where each replica's step is a function of its own
    and the dict would be each replica's, summed by `fit` into nonsense.
    """
    strategy = getattr(model, "distribute_strategy", None)
    if _replicas(strategy) == 1:
        return None
    if not isinstance(strategy, tf.distribute.MirroredStrategy):
        return (f"fit under {type(strategy).__name__} with "
                f"{_replicas(strategy)} replicas; it keeps them on one "
                "replica or under MirroredStrategy")
    if _is_tf_keras(model) and getattr(model, "jit_compile", False):
        return ("tf_keras' fit with jit_compile=True under several "
                "replicas compiles each replica's step apart")
    return None


def _replica_id() -> int:
    """The id of the replica whose step is being traced (0 with one)."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return 0
    return int(tf.get_static_value(context.replica_id_in_sync_group))


class KeptBatch:
    """Keeps `fit`'s last batch of each replica, for the deep look, while
    installed.

    `install` makes the model's train step return its batch with its logs
    under a private key, rebuilds the train function, and wraps it so that
    the key is taken out before `fit` (or any callback) sees the logs; the
    batches are then `batches`, by replica id. `uninstall` puts the
    model's own train step and train function back. The step gains no op:
    the batch it already holds becomes one more output (on the host, a
    reference; on an accelerator, the batch stays in its memory until the
    next step).

    Under `MirroredStrategy` each replica's train step runs in a thread of
    its own, one after another, and `fit` reduces what they return
    (Keras 3 averages it, tf_keras sums it) unless every replica returns
    the very same object: so every replica of one step returns the same
    dict, each adding its own batch under its id, and the dict passes the
    reduction whole.
    """

    def __init__(self) -> None:
        self.batches: Dict[int, Any] = {}
        self._model: Any = None
        self._function: Any = None
        self._own_step: Optional[Dict[str, Any]] = None
        self._gathering: Dict[int, Any] = {}
        self._gathering_graph: Any = None

    def install(self, model: Any) -> Optional[str]:
        """Starts keeping batches; None, or (nothing done) why it cannot
        (`unkept_reason`)."""
        reason = unkept_reason(model)
        if reason is not None:
            return reason
        self._model, self._function = model, model.train_function
        self._own_step = {k: v for k, v in vars(model).items()
                          if k == "train_step"}
        train_step = model.train_step
        replicas = _replicas(getattr(model, "distribute_strategy", None))

        def kept_train_step(data: Any) -> Any:
            logs = train_step(data)
            if not isinstance(logs, dict):
                return logs
            return {**logs, _BATCH_KEY: self._gather(data)}

        object.__setattr__(model, "train_step", kept_train_step)
        rebuilt = model.make_train_function(force=True)
        inner = rebuilt if callable(rebuilt) else model.train_function

        def train_function(iterator: Any) -> Any:
            try:
                logs = inner(iterator)
            except (StopIteration, tf.errors.OutOfRangeError):
                raise  # The end of an epoch: `fit` goes on.
            except BaseException:
                # `fit` ends here without `on_train_end` (a SkipStreakError,
                # an interrupt): leave the model as it was.
                self.uninstall()
                raise
            if isinstance(logs, dict) and _BATCH_KEY in logs:
                logs = dict(logs)
                batches = logs.pop(_BATCH_KEY)
                self.batches = batches if _whole(batches, replicas) else {}
            return logs

        object.__setattr__(model, "train_function", train_function)
        return None

    def _gather(self, data: Any) -> Dict[int, Any]:
        """The dict of this step's batches, with this replica's added.

        A replica whose id the dict holds already, or a step traced in
        another graph, begins the next step's dict."""
        replica = _replica_id()
        graph = tf.compat.v1.get_default_graph()
        if replica in self._gathering or graph is not self._gathering_graph:
            self._gathering, self._gathering_graph = {}, graph
        self._gathering[replica] = data
        return self._gathering

    def uninstall(self) -> None:
        """Puts the model's train step and train function back."""
        model = self._model
        if model is None:
            return
        if self._own_step:
            object.__setattr__(model, "train_step",
                               self._own_step["train_step"])
        else:
            object.__delattr__(model, "train_step")
        object.__setattr__(model, "train_function", self._function)
        self._model = self._function = self._own_step = None
        self._gathering, self._gathering_graph = {}, None
        self.batches = {}


def _whole(batches: Any, replicas: int) -> bool:
    """Whether `fit` handed back one batch of every replica, none reduced."""
    return (isinstance(batches, dict)
            and sorted(batches) == list(range(replicas))
            and not any(isinstance(t, tf.distribute.DistributedValues)
                        for t in tf.nest.flatten(list(batches.values()))))
