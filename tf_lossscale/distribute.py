"""Everything a `tf.distribute` strategy changes, in one place.

- Where a call may run: `require_replica_context` (a step runs once per
  replica) and `require_cross_replica_context` (`LossScale.update`), both
  raising `ReplicaContextError`.
- One verdict for all: `agree` (every replica votes from its replica
  context) and `cross_replica_all_finite` (votes collected from the
  cross-replica context, as `LossScale.update` does).
- Apply or skip with that verdict: `apply_or_skip` from a replica context
  (the Keras flavours), `branch` from a cross-replica one (the TF1
  optimizer).
- Strategies that cannot work: `check_supported_strategy`.

Without a strategy every function here is the plain single-device
behaviour: the verdict is the local one, and a `tf.cond` picks the branch
(under XLA, two: see `_compiled_branch`).
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional

import tensorflow as tf

from tf_lossscale import _tf_private, finite

__all__ = [
    "ReplicaContextError",
    "agree",
    "apply_or_skip",
    "branch",
    "check_supported_strategy",
    "num_replicas",
    "cross_replica_all_finite",
    "one_op_for_every_replica",
    "require_cross_replica_context",
    "require_replica_context",
]


class ReplicaContextError(RuntimeError, ValueError):
    """A call was made in the wrong `tf.distribute` context.

    Both a `RuntimeError` (TensorFlow's loss scales raise one) and a
    `ValueError` (Keras' optimizers raise one), so code written against
    either original catches it.
    """

    # AutoGraph re-raises an exception from converted code with its own
    # type only if it can rebuild it from a message: its type is one of a
    # few builtins, or its `__init__` is `Exception.__init__` (a class with
    # two bases inherits its first base's, so it is set here). Without it,
    # `tf.function` callers get AutoGraph's StagingError instead.
    __init__ = Exception.__init__


def num_replicas() -> int:
    """How many replicas the current strategy runs in sync (1 without)."""
    return tf.distribute.get_strategy().num_replicas_in_sync


def _strategy_name() -> str:
    return type(tf.distribute.get_strategy()).__name__


def require_replica_context(caller: str) -> None:
    """Raises `ReplicaContextError` in a cross-replica context.

    A step must run once per replica, where each replica votes on the
    verdict; in the cross-replica context there is no replica to vote.
    """
    if tf.distribute.in_cross_replica_context():
        raise ReplicaContextError(
            f"{caller} must be called in a replica context (inside "
            "strategy.run), not in the cross-replica context of "
            f"{_strategy_name()}.")


def require_cross_replica_context(caller: str) -> None:
    """Raises `ReplicaContextError` in a replica context under a strategy."""
    if tf.distribute.has_strategy() and (
            not tf.distribute.in_cross_replica_context()):
        raise ReplicaContextError(
            f"{caller} was called in a replica context (inside strategy.run "
            f"or a replica function) under {_strategy_name()}; call it in "
            "a cross-replica context instead: outside strategy.run, or from "
            "tf.distribute.get_replica_context().merge_call(...).")


def check_supported_strategy(caller: str) -> None:
    """Raises `ValueError` under a strategy whose variables cannot skip.

    `CentralStorageStrategy` keeps variables on one device and updates
    them from the cross-replica context, where no replica can vote; tf_keras
    refuses it at construction too.
    """
    strategy = tf.distribute.get_strategy()
    central = getattr(tf.distribute.experimental, "CentralStorageStrategy",
                      None)
    if central is not None and isinstance(strategy, central):
        name = type(strategy).__name__
        # tf_keras' sentence first (code and tests match it), then ours.
        raise ValueError(
            "Loss scaling is not supported with the tf.distribute.Strategy: "
            f"{name}. Try using a different Strategy, e.g. a "
            f"MirroredStrategy. {caller} does not support {name}; got it as "
            "the current strategy: it updates variables outside the replicas, "
            "where a step cannot be skipped. Use MirroredStrategy, "
            "MultiWorkerMirroredStrategy, OneDeviceStrategy or no strategy.")


def agree(verdict: tf.Tensor) -> tf.Tensor:
    """In a replica context, True iff `verdict` holds on every replica.

    Every replica must call it (it is a collective) and gets the same
    answer, so all of them apply or skip together. With one replica it
    returns `verdict` unchanged.
    """
    ctx = tf.distribute.get_replica_context()
    if ctx is None:
        raise ReplicaContextError(
            "agree() must be called in a replica context; it was called in "
            "a cross-replica context.")
    if ctx.num_replicas_in_sync == 1:
        return verdict
    votes = ctx.all_reduce(
        tf.distribute.ReduceOp.SUM, tf.cast(verdict, tf.float32))
    return tf.equal(votes, float(ctx.num_replicas_in_sync))


def cross_replica_all_finite(grads: Any) -> tf.Tensor:
    """`finite.all_finite` over every replica's gradients.

    Called from a cross-replica context (or with no strategy). Under a
    strategy each replica checks its own gradients and the votes are
    summed, so a NaN on any one replica makes the verdict False for all.

    Raises:
      ReplicaContextError: called in a replica context, or given
        per-replica gradients outside their strategy's scope.
    """
    if not tf.distribute.has_strategy():
        _reject_distributed_values(grads)
        return finite.all_finite(grads)
    require_cross_replica_context("LossScale.update()")
    strategy = tf.distribute.get_strategy()
    flat = tf.nest.flatten(grads)
    votes = strategy.extended.call_for_each_replica(
        lambda g: tf.cast(finite.all_finite(g), tf.float32), args=(flat,))
    total = strategy.reduce(tf.distribute.ReduceOp.SUM, votes, axis=None)
    return tf.equal(total, float(strategy.num_replicas_in_sync))


def _reject_distributed_values(grads: Any) -> None:
    """Per-replica values outside a strategy's scope cannot be voted on."""
    for g in tf.nest.flatten(grads):
        if isinstance(g, tf.distribute.DistributedValues):
            raise ReplicaContextError(
                "LossScale.update() got per-replica gradients "
                f"({type(g).__name__}) outside the scope of their strategy; "
                "call it inside `with strategy.scope():` (in a cross-replica "
                "context), so that every replica's gradients are checked.")


def one_op_for_every_replica(op: Any) -> Any:
    """The op that runs every replica's `op`, the same object on each.

    In a graph with several replicas, each replica builds its own train op,
    so `strategy.run(step)` would give a `PerReplica` that `Session.run`
    refuses; tf_keras' wrapper returns the one op of its cross-replica merge
    call instead. A merge call here does the same (at trace time only: at
    run time it is one `group`). Eagerly, or with one replica, `op` is
    returned as it is.
    """
    context = tf.distribute.get_replica_context()
    if (op is None or tf.executing_eagerly() or context is None
            or context.num_replicas_in_sync == 1):
        return op
    return context.merge_call(
        lambda strategy, ops: strategy.group(ops), args=(op,))


def branch(verdict: Any, apply: Callable[[], Any],
           skip: Callable[[], Any], compiled_whole: bool = False) -> Any:
    """Runs `apply()` if `verdict`, else `skip()`, for their effects.

    A Python bool picks in Python; a tensor through `tf.cond` (eagerly only
    one branch runs), kept as one function call when traced with a single
    replica rather than lowered into a Switch per captured tensor
    (`_tf_private.run_cond_as_one_call`). Returns what to group into a TF1
    train op.
    """
    if isinstance(verdict, bool):
        return apply() if verdict else skip()
    if compiled_whole and num_replicas() == 1:
        return _compiled_branch(verdict, apply, skip)

    def run(fn: Callable[[], Any]) -> Callable[[], tf.Tensor]:
        def effects() -> tf.Tensor:
            # A TF1 graph runs only what the branch's output depends on.
            done = [x for x in tf.nest.flatten(fn())
                    if isinstance(x, (tf.Operation, tf.Tensor))]
            with tf.control_dependencies(done):
                # Both branches return the same structure.
                return tf.identity(tf.constant(0))
        return effects

    taken = tf.cond(verdict, run(apply), run(skip))
    # One call runs on one device: with replicas on several devices, the
    # branch must stay lowered so each replica's part runs on its own.
    if not tf.executing_eagerly() and (
            num_replicas() == 1):
        _tf_private.run_cond_as_one_call(taken)
    return taken


def _compiled_branch(verdict: tf.Tensor, apply: Callable[[], Any],
                     skip: Callable[[], Any]) -> tf.Tensor:
    """`branch` in a caller that XLA compiles whole: two conditionals.

    XLA turns a conditional whose branches are elementwise (an optimizer's
    update, and a skip that only advances `iterations`) into a select per
    variable and slot, which computes both sides and, where an update reads
    a slot it also writes (Adam's moments), copies every such slot first.
    A conditional with an empty branch stays a conditional: the update runs
    in place in one branch and the other does nothing. So the update and
    the skip each get one, with nothing on the other side, whatever the
    skip holds. (With the skip record in the skip branch, one conditional
    also stays one, and measured the same as two under XLA on CPU.)
    Returns the verdict (there is no TF1 train op to group here).
    """
    def effects(fn: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            fn()
        return run

    def nothing() -> None:
        return None

    tf.cond(verdict, effects(apply), nothing)
    tf.cond(verdict, nothing, effects(skip))
    return verdict


def apply_or_skip(verdict: tf.Tensor, grads: List[Any],
                  apply: Callable[[List[Any]], Any],
                  skip: Callable[[], Any],
                  record: Optional[Callable[[List[Any]], Any]] = None,
                  compiled_whole: bool = False) -> Any:
    """Runs `apply(grads)` if `verdict`, else `skip()`, from a replica context.

    `verdict` must already be the same on every replica (`agree`): each
    replica then takes the same branch, so collectives inside `apply` (the
    gradient all-reduce) match. Strategies that update through `merge_call`
    (MirroredStrategy on CPU, or without XLA) cannot hold a `merge_call`
    inside a branch traced in a replica context, so there the branch is
    taken in the cross-replica context and `apply` runs per replica, as
    Keras' own optimizers do. `record(grads)`, if given, runs in the skip
    branch only, before `skip`, in each replica's context (it may hold
    collectives: every replica takes the same branch). Returns what
    `branch` returns.
    """
    if _tf_private.strategy_supports_no_merge_call():
        def skip_here() -> Any:
            return [record(grads), skip()] if record else skip()
        return branch(verdict, lambda: apply(grads), skip_here,
                      compiled_whole)

    # `grads` pass through merge_call's args: there they are each replica's
    # own (a closure would hold only the first replica's).
    def cross_replica(strategy: tf.distribute.Strategy, verdict: Any,
                      grads: Any) -> Any:
        # Every replica holds the same agreed verdict; read the first.
        first = strategy.experimental_local_results(verdict)[0]

        def skip_here() -> Any:
            if record is None:
                return skip()
            return [strategy.extended.call_for_each_replica(
                record, args=(grads,)), skip()]
        return branch(first,
                      lambda: strategy.extended.call_for_each_replica(
                          apply, args=(grads,)),
                      skip_here, compiled_whole)

    return tf.distribute.get_replica_context().merge_call(
        cross_replica, args=(verdict, grads))
