"""Why a step was skipped: which gradients were NaN or Inf, where and when.

Recorded only inside the skip branch of the apply-or-skip conditional
(`distribute.apply_or_skip`), so a finite step runs none of it: the traced
finite path gains no op per variable. Per skipped step it keeps, in a few
small variables that are never in a checkpoint (like `skipped_steps`):

- `count`: how many gradients were non-finite (on the replica named);
- `indices` / `kinds`: the first `MAX_NAMED` of them in variable order,
  each 1 (has a NaN) or 2 (has an Inf, no NaN);
- `step`: `iterations` when the step ran, and `scale`: the loss scale the
  step used;
- `replica`: the first replica (in replica-id order) that saw a non-finite
  gradient, and `replicas`: how many did;
- `streak` and `first_step`: skipped steps in a row ending at `step`, and
  the step that began them (a finite step never writes: the streak is
  over when the next `iterations` is past `step + 1`).

Names are Python strings known when the step is traced: the graph records
indices, and `read` maps them to the variables' names on the host, into a
frozen `SkipRecord`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import (
    Any,
    Callable,
    Dict,
    List,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
)

import tensorflow as tf

from tf_lossscale import finite
from tf_lossscale._numerics import all_axes, dense_values

__all__ = [
    "MAX_NAMED", "RecordVariables", "SkipRecord", "SkipStreakError",
    "make_variables", "read", "record_replicas", "recorder", "scale_text"]

# How many non-finite gradients a record names.
MAX_NAMED = 8
# The kinds of the step's own check (`finite.kinds_of`), which it uses too.
_NAN, _INF = finite.KIND_NAN, finite.KIND_INF


class SkipStreakError(tf.errors.InvalidArgumentError):
    """A run of skipped steps reached `max_consecutive_skips` (or min_scale).

    Raised by the optimizer's step when `max_consecutive_skips` is set. A
    subclass of `tf.errors.InvalidArgumentError`, which is what TensorFlow
    raises when the same check fails inside a `tf.function`, so one
    `except tf.errors.InvalidArgumentError` catches both; eagerly it is
    this type, with `record` holding the last `SkipRecord`.
    """

    def __init__(self, message: str,
                 record: Optional["SkipRecord"] = None) -> None:
        super().__init__(None, None, message)
        self.record = record


@dataclasses.dataclass(frozen=True)
class SkipRecord:
    """The last skipped step, as `LossScaleOptimizer.last_skip` gives it.

    Attributes:
      step: `iterations` when the step ran (0 for the first step).
      scale: the loss scale the step used.
      count: how many gradients were non-finite (on `replica`).
      total: how many gradients the step had (None ones excluded).
      names: the variable paths of the first non-finite gradients (up to
        8), in variable order.
      kinds: for each name, "NaN" or "Inf".
      replica: the first replica that saw a non-finite gradient (0 without
        a strategy); `worker`: its worker under MultiWorkerMirroredStrategy.
      replicas: how many replicas saw one.
      streak: skipped steps in a row ending at `step`; `first_step` is the
        step that began them.
    """

    step: int
    scale: float
    count: int
    total: int
    names: Tuple[str, ...]
    kinds: Tuple[str, ...]
    replica: int
    replicas: int
    streak: int
    first_step: int
    worker: Optional[int] = None

    @property
    def kind(self) -> str:
        """"NaN", "Inf" or "NaN and Inf": what the named gradients held."""
        found = sorted(set(self.kinds), key=("NaN", "Inf").index)
        return " and ".join(found) or "NaN/Inf"

    def describe(self) -> str:
        """`step 12 skipped: 2 of 40 gradients non-finite (Inf): a, b; scale 2^14`."""
        if self.total == 0:  # Restored (`save_telemetry`): only the run.
            return (f"step {self.step} skipped, the last of {self.streak} "
                    f"in a row from step {self.first_step} (restored from a "
                    "save, which keeps no gradients or scale)")
        more = ", ..." if self.count > len(self.names) else ""
        where = ""
        if self.worker is not None:
            where = f" on worker {self.worker}"
        elif self.replicas:
            where = f" on replica {self.replica}"
            if self.replicas > 1:
                where += f" (and {self.replicas - 1} other)"
        return (f"step {self.step} skipped{where}: {self.count} of "
                f"{self.total} gradients non-finite ({self.kind}): "
                f"{', '.join(self.names)}{more}; scale {scale_text(self.scale)}")

    def __str__(self) -> str:
        return self.describe()


def scale_text(scale: float) -> str:
    """`2^14` for a power of two, else the number."""
    if scale > 0 and math.isfinite(scale):
        exponent = math.log2(scale)
        if exponent == int(exponent):
            return f"2^{int(exponent)}"
    return f"{scale:g}"


class RecordVariables(NamedTuple):
    """The variables of one optimizer's record (never in a checkpoint)."""

    step: tf.Variable
    scale: tf.Variable
    count: tf.Variable
    total: tf.Variable
    indices: tf.Variable
    kinds: tf.Variable
    replica: tf.Variable
    replicas: tf.Variable
    streak: tf.Variable
    first_step: tf.Variable


def _variable(initial: Any, dtype: tf.DType, name: str) -> tf.Variable:
    # Every replica writes the same agreed values (after an all-reduce).
    return tf.Variable(
        initial, dtype=dtype, trainable=False, name=name,
        synchronization=tf.VariableSynchronization.ON_WRITE,
        aggregation=tf.VariableAggregation.NONE)


def make_variables() -> RecordVariables:
    """Creates the record's variables (under the current strategy)."""
    with tf.init_scope():
        return RecordVariables(
            step=_variable(-1, tf.int64, "last_skip_step"),
            scale=_variable(0.0, tf.float32, "last_skip_scale"),
            count=_variable(0, tf.int32, "last_skip_count"),
            total=_variable(0, tf.int32, "last_skip_total"),
            indices=_variable([-1] * MAX_NAMED, tf.int32,
                              "last_skip_indices"),
            kinds=_variable([0] * MAX_NAMED, tf.int32, "last_skip_kinds"),
            replica=_variable(0, tf.int32, "last_skip_replica"),
            replicas=_variable(0, tf.int32, "last_skip_replicas"),
            streak=_variable(0, tf.int64, "skip_streak"),
            first_step=_variable(-1, tf.int64, "skip_streak_first_step"))


def _kinds(grads: Sequence[Any]) -> tf.Tensor:
    """Per present gradient: 0 finite, 1 has a NaN, 2 has an Inf (no NaN).

    Under XLA the step's check found them already (`finite.kinds_of`): one
    small tensor, instead of reading every gradient again here.
    """
    known = finite.kinds_of([dense_values(g) for g in grads])
    if known is not None:
        return known
    if not grads:
        return tf.zeros([0], tf.int32)
    # Four ops a gradient (each costs tracing time in every step function):
    # the reduction axes are shared by rank.
    axes: Dict[int, tf.Tensor] = {}
    nans, finite_ones = [], []
    for grad in grads:
        values = dense_values(grad)
        axis = all_axes(values, axes)
        nans.append(tf.reduce_any(tf.math.is_nan(values), axis))
        finite_ones.append(tf.reduce_all(tf.math.is_finite(values), axis))
    return tf.where(tf.stack(nans), _NAN,
                    tf.where(tf.stack(finite_ones), 0, _INF))


def _local_summary(grads: Sequence[Any]) -> tf.Tensor:
    """[count, first indices..., their kinds...] of this replica, as float32.

    Static shapes only (XLA compiles it too), and no `top_k`: XLA's TopK
    marks its output's size dynamic, and one dynamic size anywhere in a
    step makes XLA inline every call of the module, the random-bit
    generator of each Dropout layer too, which then costs a step under
    `jit_compile=True` 20-40 times what it costs as a call. Bad gradient
    `i`, the `r`-th bad one (from 0), is the `r`-th first index: a
    one-hot sum over the gradients.
    """
    kinds = _kinds([g for g in grads if g is not None])
    n = int(kinds.shape[0])
    bad = kinds > 0
    seen = tf.math.cumsum(tf.cast(bad, tf.int32))  # bad ones up to each
    slot = tf.where(bad, seen - 1, MAX_NAMED)  # MAX_NAMED: no slot
    first = tf.reduce_sum(
        tf.one_hot(slot, MAX_NAMED, dtype=tf.int32)
        * tf.range(1, n + 1)[:, None], 0) - 1
    first_kinds = tf.gather(tf.concat([kinds, [0]], 0),
                            tf.where(first < 0, n, first))
    count = seen[-1] if n else tf.constant(0)
    return tf.cast(tf.concat([[count], first, first_kinds], 0), tf.float32)


def _agreed_summary(summary: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor,
                                                 tf.Tensor]:
    """Every replica's summary; the first non-finite one, its id, the number.

    Each replica puts its row at its id in a zero matrix; one all-reduce
    gives every replica every row, so all write the same record.
    """
    ctx = tf.distribute.get_replica_context()
    replicas = 1 if ctx is None else ctx.num_replicas_in_sync
    if replicas == 1:
        seen = tf.cast(summary[0] > 0, tf.int32)
        return summary, tf.constant(0), seen
    rid = tf.cast(ctx.replica_id_in_sync_group, tf.int32)
    rows = tf.scatter_nd([[rid]], [summary], [replicas, 2 * MAX_NAMED + 1])
    return _first_bad_row(ctx.all_reduce(tf.distribute.ReduceOp.SUM, rows))


def _first_bad_row(rows: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Of one summary per replica: the first non-finite one, its replica id
    and how many replicas saw a non-finite gradient."""
    saw = rows[:, 0] > 0
    first = tf.cast(tf.argmax(tf.cast(saw, tf.int32)), tf.int32)
    return rows[first], first, tf.reduce_sum(tf.cast(saw, tf.int32))


def _writes(variables: RecordVariables, agreed: Tuple[tf.Tensor, tf.Tensor,
                                                    tf.Tensor],
            total: int, step: tf.Tensor, scale: tf.Tensor) -> List[Any]:
    """The assignments that record one skipped step (see the module)."""
    summary, replica, seen = agreed
    step = tf.cast(step, tf.int64)
    last = tf.convert_to_tensor(variables.step)
    going_on = tf.logical_and(last >= 0, tf.equal(last + 1, step))
    streak = tf.where(going_on, tf.convert_to_tensor(variables.streak)
                      + 1, tf.constant(1, tf.int64))
    first_step = tf.where(
        going_on, tf.convert_to_tensor(variables.first_step), step)
    as_int = tf.cast(summary, tf.int32)
    return [
        variables.step.assign(step),
        variables.scale.assign(tf.cast(scale, tf.float32)),
        variables.count.assign(as_int[0]),
        variables.total.assign(total),
        variables.indices.assign(as_int[1:MAX_NAMED + 1]),
        variables.kinds.assign(as_int[MAX_NAMED + 1:]),
        variables.replica.assign(replica),
        variables.replicas.assign(seen),
        variables.streak.assign(streak),
        variables.first_step.assign(first_step),
    ]


def recorder(variables: RecordVariables,
             iterations: Callable[[], tf.Tensor],
             check: Optional[Callable[[RecordVariables], Any]] = None,
             ) -> Callable[[List[Any], tf.Tensor], Any]:
    """The function the skip branch runs: records `grads` (in a replica
    context) and, with `check`, runs it on the written record."""

    def record(grads: List[Any], scale: tf.Tensor) -> Any:
        agreed = _agreed_summary(_local_summary(grads))
        writes = _writes(variables, agreed,
                         len([g for g in grads if g is not None]),
                         tf.convert_to_tensor(iterations()), scale)
        if check is None:
            return tf.group(*writes)
        with tf.control_dependencies(writes):
            return tf.group(check(variables))

    return record


def record_replicas(variables: RecordVariables,
                    per_replica: Sequence[Sequence[Any]], step: tf.Tensor,
                    scale: tf.Tensor) -> Any:
    """Records a skipped step from every replica's gradients at once (in a
    cross-replica context, as the TF1 optimizer's update runs): `per_replica`
    holds one list of gradients per replica, in replica-id order."""
    rows = tf.stack([_local_summary(grads) for grads in per_replica])
    total = len([g for g in per_replica[0] if g is not None])
    return tf.group(*_writes(variables, _first_bad_row(rows), total, step,
                             scale))


def read(variables: RecordVariables, names: Sequence[str],
         worker_of: Optional[Callable[[int], Optional[int]]] = None
         ) -> Optional[SkipRecord]:
    """The last skipped step, or None if none was (one host read)."""
    values = [tf.convert_to_tensor(v) for v in variables]
    (step, scale, count, total, indices, kinds, replica, replicas, streak,
     first_step) = [v.numpy() for v in values]
    if int(step) < 0:
        return None
    chosen = [(int(i), int(k)) for i, k in zip(indices, kinds) if i >= 0]
    return SkipRecord(
        step=int(step), scale=float(scale), count=int(count),
        total=int(total),
        names=tuple(names[i] if i < len(names) else f"#{i}"
                    for i, _ in chosen),
        kinds=tuple("NaN" if k == _NAN else "Inf" for _, k in chosen),
        replica=int(replica), replicas=int(replicas), streak=int(streak),
        first_step=int(first_step),
        worker=None if worker_of is None else worker_of(int(replica)))
