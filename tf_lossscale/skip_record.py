"""Why a step was skipped: which gradients were NaN or Inf, where and when.

Recorded only inside the skip branch of the apply-or-skip conditional
(`distribute.apply_or_skip`), so a finite step runs none of it: the traced
finite path gains no op per variable. Per skipped step it keeps, in four
small variables (`RecordVariables`; checkpoints hold only the run of skips,
and only with `save_telemetry=True`, like `skipped_steps`):

- `count`: how many gradients were non-finite (on the replica named);
- `indices` / `kinds`: the first `MAX_NAMED` of them in backpropagation
  order (`backprop_order`: the first is where non-finite values entered,
  nearest the loss), or in variable order where that order is unknown
  (eager), each 1 (has a NaN), 2 (has an Inf, no NaN) or 3 (both: the
  mark of an overflow, Inf - Inf, where it entered); `farthest`: the
  last non-finite one in that order (nearest the input);
- `loss`: whether the step's loss was finite (0 not seen, 1 finite, 2
  finite but the scaled loss not: the scale overflowed the loss's dtype,
  3 NaN, 4 Inf), read from the loss `get_scaled_loss` / `scale_loss` saw;
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

from tf_lossscale import backprop_order, finite
from tf_lossscale._numerics import all_axes, dense_values

__all__ = [
    "MAX_NAMED", "RecordVariables", "SkipRecord", "SkipStreakError",
    "loss_code", "make_variables", "read", "record_replicas", "recorder",
    "scale_text"]

# How many non-finite gradients a record names.
MAX_NAMED = 8
# The kinds of the step's own check (`finite.Verdict.kinds`), which it uses too.
_NAN, _INF = finite.KIND_NAN, finite.KIND_INF
# A gradient holding both (found in the skip branch only).
_BOTH = 3
_KIND_TEXT = {_NAN: "NaN", _INF: "Inf", _BOTH: "NaN and Inf"}
# A replica's summary: count, MAX_NAMED indices and kinds, farthest, loss.
_SUMMARY = 2 * MAX_NAMED + 3
# `loss` codes, and what `SkipRecord.loss` says for each.
_LOSS_TEXT = {0: None, 1: "finite", 2: "overflowed when scaled", 3: "NaN",
              4: "Inf"}


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
        8), in `order`: with "backprop", the first is nearest the loss,
        where non-finite values entered the backward pass.
      kinds: for each name, "NaN", "Inf" or "NaN and Inf" (both: what
        float16 overflow leaves where it entered, Inf - Inf).
      replica: the first replica that saw a non-finite gradient (0 without
        a strategy); `worker`: its worker under MultiWorkerMirroredStrategy.
      replicas: how many replicas saw one.
      streak: skipped steps in a row ending at `step`; `first_step` is the
        step that began them.
      order: "backprop" (the order in which the step's gradient tape made
        the gradients, read from the traced step) or "variable" (eager
        steps, where that order is unknown).
      farthest: the non-finite gradient farthest from the loss (in
        `order`), or None.
      loss: the step's loss: "finite", "NaN", "Inf", "overflowed when
        scaled" (finite, but not once multiplied by the scale), or None
        where no `get_scaled_loss` / `scale_loss` call saw it.
      entered: what entered at `source`, where more than the gradients
        told it: "Inf" where a replay of the step (the deep look,
        `LossScaleMonitor(deep_look=True)`) found float16 overflow (its
        first non-finite op, in the backward pass, held an Inf, and the
        same replay at scale 1 was finite); "NaN" where the replay at
        scale 1 stayed non-finite, or the run reached min_scale (`at_floor`):
        a real NaN. None: only the gradients are known, and where the
        source layer's hold NaN only after a finite loss (`undecided`),
        they cannot tell overflow from a real NaN (a convolution's or an
        LSTM's filter gradients sum Inf x 0 and Inf - Inf). Never set by
        the optimizer.
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
    order: str = "variable"
    farthest: Optional[str] = None
    loss: Optional[str] = None
    entered: Optional[str] = None

    @property
    def kind(self) -> str:
        """"NaN", "Inf" or "NaN and Inf": what the named gradients held."""
        parts = {p for k in self.kinds for p in k.split(" and ")}
        found = sorted(parts, key=("NaN", "Inf").index)
        return " and ".join(found) or "NaN/Inf"

    @property
    def source(self) -> Optional[str]:
        """The layer (variable path without its last part) nearest the loss
        whose gradient was non-finite: where non-finite values entered the
        backward pass. None in variable order."""
        if self.order != "backprop" or not self.names:
            return None
        return backprop_order.layer_of(self.names[0])

    @property
    def source_kind(self) -> str:
        """"Inf" if a named gradient of `source` held an Inf (overflow),
        or a replay found overflow (`entered`), else what the first named
        gradient held."""
        if self.entered is not None:
            return self.entered
        if not self.kinds:
            return "NaN/Inf"
        layer = self.source
        if layer is None:
            return self.kind
        mine = [k for n, k in zip(self.names, self.kinds)
                if backprop_order.layer_of(n) == layer]
        return "Inf" if any("Inf" in k for k in mine) else "NaN"

    @property
    def undecided(self) -> bool:
        """Whether the gradients alone leave overflow and a real NaN apart
        undecided: the loss was finite (or not seen), the source layer's
        gradients hold NaN only, and nothing else (`entered`) has told.
        Float16 overflow inside a convolution or an LSTM leaves exactly
        that, and so does the gradient of `sqrt` at 0: a run that the
        back-off ends was overflow; one that reaches min_scale was not."""
        return (self.entered is None and self.source is not None
                and self.origin in ("backward", None)
                and self.source_kind == "NaN")

    def at_floor(self) -> "SkipRecord":
        """This record once its run has reached min_scale: no scale cured
        it, so what entered is what the gradients hold (a real NaN)."""
        if not self.undecided:
            return self
        return dataclasses.replace(self, entered=self.source_kind)

    @property
    def origin(self) -> Optional[str]:
        """Where the non-finite values came from: "forward" (the loss was
        NaN or Inf: an activation, the loss function or the input batch),
        "scaling" (the scale overflowed the loss's dtype), "backward" (the
        loss was finite), or None (the loss was not seen)."""
        return {"finite": "backward", "NaN": "forward", "Inf": "forward",
                "overflowed when scaled": "scaling"}.get(self.loss or "")

    def _cause(self) -> str:
        """What made the step's gradients non-finite, as far as known."""
        origin = self.origin
        if origin == "forward":
            return (f"the loss was {self.loss}: the forward pass made it "
                    "(an activation, the loss function or the input batch)")
        if origin == "scaling":
            return ("the loss was finite but overflowed its dtype when "
                    "scaled: the scale is too large for it")
        source = self.source
        if source is None:
            return ""
        finite = ("the loss was finite; float16 overflow can leave NaN "
                  "here" if self.undecided else "the loss was finite")
        pass_ = {"backward": f" in the backward pass ({finite})",
                 None: (" (float16 overflow can leave NaN here)"
                        if self.undecided else "")}[origin]
        return f"{self.source_kind} entered at {source}{pass_}"

    def _span(self) -> str:
        """The non-finite gradients: `, a .. b` from the source's layer to
        the farthest one's, or their names."""
        if self.order != "backprop":
            more = ", ..." if self.count > len(self.names) else ""
            order = ", in variable order" if self.count > 1 else ""
            return (f" ({self.kind}){order}: "
                    f"{', '.join(self.names)}{more}")
        if self.count == 1 and self.names:
            return f": {self.names[0]}"
        near = self.source
        far = (backprop_order.layer_of(self.farthest)
               if self.farthest else near)
        if near == far:
            return f" in {near}"
        return f", {near} .. {far}"

    def describe(self) -> str:
        """`step 0 skipped on replica 0: Inf entered at l11 in the backward
        pass (the loss was finite); 24 of 26 gradients non-finite, l11 ..
        l0; scale 2^30` (eagerly: `... 2 of 40 gradients non-finite (Inf),
        in variable order: a, b; scale 2^14`)."""
        if self.total == 0:  # Restored (`save_telemetry`): only the run.
            return (f"step {self.step} skipped, the last of {self.streak} "
                    f"in a row from step {self.first_step} (restored from a "
                    "save, which keeps no gradients or scale)")
        return (f"step {self.step} skipped{self._where()}: {self.summary()}; "
                f"scale {scale_text(self.scale)}")

    def _where(self) -> str:
        where = ""
        if self.worker is not None:
            where = f" on worker {self.worker}"
        elif self.replicas:
            where = f" on replica {self.replica}"
            if self.replicas > 1:
                where += f" (and {self.replicas - 1} other)"
        return where

    def summary(self) -> str:
        """Why the step was skipped, without its step, replica and scale:
        `Inf entered at net/l11 in the backward pass (the loss was finite);
        24 of 26 gradients non-finite, net/l11 .. net/l0`."""
        cause = self._cause()
        counted = (f"{self.count} of {self.total} gradients non-finite"
                   f"{self._span()}")
        if self.order == "backprop" and cause:
            body = f"{cause}; {counted}"
        elif cause:
            body = f"{counted}; {cause}"
        else:
            body = counted
        return body

    def verdict_at_floor(self) -> str:
        """What a run of skipped steps that reached `min_scale` means."""
        origin = self.origin
        if origin == "forward":
            return (f"the loss itself was {self.loss}: a fault of the forward "
                    "pass (the input batch, an activation or the loss "
                    "function), which no loss scale fixes")
        if origin == "scaling":
            return ("the scaled loss overflows even at the smallest scale: "
                    "the loss is too large for its dtype (compute it in "
                    "float32)")
        if origin == "backward":
            return ("the loss was finite and the gradients are still "
                    "non-finite at the smallest scale: not float16 overflow "
                    f"but a real {self.source_kind} in the backward pass (the "
                    "gradient of a log, sqrt or division at zero, a "
                    "diverging learning rate)")
        return ("this looks like a real NaN/Inf, not float16 overflow (bad "
                "input data, a log or division of zero, a diverging "
                "learning rate)")

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
    """The variables of one optimizer's record.

    The run of skips (`step`, `streak`, `first_step`) has a variable each:
    `save_telemetry=True` saves them under their own keys. The rest, which
    no checkpoint holds, is one float32 vector (`facts`, laid out by
    `_FACTS`): a compiled step pays a few microseconds a call for every
    variable it takes, so eight fewer variables make every step cheaper.
    float32 holds each of its integers exactly (all below 2**24).
    """

    step: tf.Variable
    streak: tf.Variable
    first_step: tf.Variable
    facts: tf.Variable

    def used_scale(self) -> tf.Tensor:
        """The scale the last skipped step used."""
        return self.facts[_FACTS["scale"].start]

    def named_indices(self) -> tf.Tensor:
        """int32 positions of the named non-finite gradients (-1: none)."""
        return tf.cast(self.facts[_FACTS["indices"]], tf.int32)


def _layout(fields: Sequence[Tuple[str, int]]) -> Dict[str, slice]:
    at, out = 0, {}
    for name, size in fields:
        out[name] = slice(at, at + size)
        at += size
    return out


# `facts`: the scale, then the agreed summary of `_local_summary` (count,
# indices, kinds, farthest, loss: `_SUMMARY` values), then the number of
# present gradients, the replica named and how many replicas saw one.
_FACTS = _layout([("scale", 1), ("count", 1), ("indices", MAX_NAMED),
                  ("kinds", MAX_NAMED), ("farthest", 1), ("loss", 1),
                  ("total", 1), ("replica", 1), ("replicas", 1)])
# Before any skipped step: no index (-1) and no farthest one (-1), else 0.
_FACTS_START = [-1.0 if key in ("indices", "farthest") else 0.0
                for key, at in _FACTS.items() for _ in range(at.stop - at.start)]


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
            streak=_variable(0, tf.int64, "skip_streak"),
            first_step=_variable(-1, tf.int64, "skip_streak_first_step"),
            facts=_variable(_FACTS_START, tf.float32, "last_skip_facts"))


def _kinds(grads: Sequence[Any], known: Optional[tf.Tensor]) -> tf.Tensor:
    """Per present gradient: 0 finite, 1 has a NaN, 2 has an Inf (no NaN),
    3 has both.

    Compiled whole by XLA the step's check found them already (`known`,
    `finite.Verdict.kinds`): one small tensor, instead of reading every
    gradient again here; it tells no 3 from 1 (a gradient with both counts
    as NaN).
    """
    if known is not None:
        return known
    if not grads:
        return tf.zeros([0], tf.int32)
    # Four ops a gradient (each costs tracing time in every step function):
    # the reduction axes are shared by rank.
    axes: Dict[int, tf.Tensor] = {}
    nans, infs = [], []
    for grad in grads:
        values = dense_values(grad)
        axis = all_axes(values, axes)
        nans.append(tf.reduce_any(tf.math.is_nan(values), axis))
        infs.append(tf.reduce_any(tf.math.is_inf(values), axis))
    nan, inf = tf.stack(nans), tf.stack(infs)
    return tf.where(nan, tf.where(inf, _BOTH, _NAN), tf.where(inf, _INF, 0))


def loss_code(loss: Optional[Tuple[Any, Any]]) -> tf.Tensor:
    """The record's `loss` code of a (loss, scaled loss) pair: 0 (None, or
    not floating point), 1 finite, 2 the scaled loss only non-finite, 3 the
    loss holds a NaN, 4 an Inf. Runs in the skip branch only."""
    if loss is None:
        return tf.constant(0)
    unscaled, scaled = (tf.convert_to_tensor(x) for x in loss)
    if not (unscaled.dtype.is_floating and scaled.dtype.is_floating):
        return tf.constant(0)
    has_nan = tf.reduce_any(tf.math.is_nan(unscaled))
    finite_loss = tf.reduce_all(tf.math.is_finite(unscaled))
    finite_scaled = tf.reduce_all(tf.math.is_finite(scaled))
    return tf.where(finite_loss, tf.where(finite_scaled, 1, 2),
                    tf.where(has_nan, 3, 4))


def _local_summary(grads: Sequence[Any], ranks: Optional[Sequence[int]],
                   loss: tf.Tensor, known: Optional[tf.Tensor] = None
                   ) -> tf.Tensor:
    """[count, first indices..., their kinds..., farthest, loss] of this
    replica, as float32.

    The first indices are the first `MAX_NAMED` bad gradients in
    backpropagation order, the nearest to the loss first (`ranks`: each
    gradient's place in that order, known when the step is traced; None:
    variable order); `farthest` is the bad one farthest from the loss.
    `known`: the present gradients' kinds, if the step's check found them.

    Static shapes only (XLA compiles it too), and no `top_k`: XLA's TopK
    marks its output's size dynamic, and one dynamic size anywhere in a
    step makes XLA inline every call of the module, the random-bit
    generator of each Dropout layer too, which then costs a step under
    `jit_compile=True` 20-40 times what it costs as a call. So the kinds
    are put in backpropagation order by a permutation fixed at trace time,
    and the `r`-th bad one (from 0) fills slot `r` by a one-hot sum.
    """
    present = [g for g in grads if g is not None]
    kinds = _kinds(present, known)
    n = int(kinds.shape[0])
    order = list(range(n)) if ranks is None else sorted(
        range(n), key=lambda i: ranks[i])
    if order != list(range(n)):
        kinds_in_order = tf.gather(kinds, order)
    else:
        kinds_in_order = kinds
    original = tf.constant(order + [-1], tf.int32)  # position -> index
    bad = kinds_in_order > 0
    seen = tf.math.cumsum(tf.cast(bad, tf.int32))  # bad ones up to each
    slot = tf.where(bad, seen - 1, MAX_NAMED)  # MAX_NAMED: no slot
    at = tf.reduce_sum(tf.one_hot(slot, MAX_NAMED, dtype=tf.int32)
                       * tf.range(1, n + 1)[:, None], 0) - 1
    at = tf.where(at < 0, n, at)
    first = tf.gather(original, at)
    first_kinds = tf.gather(tf.concat([kinds_in_order, [0]], 0), at)
    count = seen[-1] if n else tf.constant(0)
    last = tf.cast(tf.argmax(tf.concat(
        [tf.where(bad, tf.range(1, n + 1), 0), [0]], 0)), tf.int32)
    farthest = tf.where(count > 0, tf.gather(original, last), -1)
    return tf.cast(tf.concat([[count], first, first_kinds, [farthest],
                              [tf.cast(loss, tf.int32)]], 0), tf.float32)


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
    rows = tf.scatter_nd([[rid]], [summary], [replicas, _SUMMARY])
    return _first_bad_row(ctx.all_reduce(tf.distribute.ReduceOp.SUM, rows))


def _first_bad_row(rows: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Of one summary per replica: the first non-finite one, its replica id
    and how many replicas saw a non-finite gradient.

    A replica whose own loss was not finite comes first: where the replicas'
    gradients are summed before the check (tf_keras), every replica sees a
    NaN that one replica's batch made, and that replica is the one to name.
    """
    saw = tf.cast(rows[:, 0] > 0, tf.int32)
    own_loss = tf.cast(rows[:, -1] >= 2, tf.int32)  # Not finite, or scaled.
    first = tf.cast(tf.argmax(saw * (1 + own_loss)), tf.int32)
    return rows[first], first, tf.reduce_sum(saw)


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
    facts = tf.concat([
        [tf.cast(scale, tf.float32)], summary,
        tf.cast(tf.stack([total, replica, seen]), tf.float32)], 0)
    return [
        variables.step.assign(step),
        variables.facts.assign(facts),
        variables.streak.assign(streak),
        variables.first_step.assign(first_step),
    ]


def recorder(variables: RecordVariables,
             iterations: Callable[[], tf.Tensor],
             check: Optional[Callable[[RecordVariables], Any]] = None,
             ranks: Optional[Sequence[int]] = None,
             loss: Optional[Callable[[], Optional[Tuple[Any, Any]]]] = None,
             ) -> Callable[[List[Any], tf.Tensor, Optional[tf.Tensor], bool],
                           Any]:
    """The function the skip branch runs: records `grads` (in a replica
    context) and, with `check`, runs it on the written record.

    `ranks`: each present gradient's place in backpropagation order
    (`backprop_order.ranks`), or None; `loss()`: this replica's (loss,
    scaled loss), called in the skip branch, or None if not seen. The
    record is handed the step's scale, the kinds the step's check found (or
    None) and whether the step is compiled whole by XLA, where `check` is
    left out (XLA has no string op and drops assertions).
    """

    def record(grads: List[Any], scale: tf.Tensor,
               kinds: Optional[tf.Tensor] = None,
               compiled_whole: bool = False) -> Any:
        code = loss_code(None if loss is None else loss())
        agreed = _agreed_summary(_local_summary(grads, ranks, code, kinds))
        writes = _writes(variables, agreed,
                         len([g for g in grads if g is not None]),
                         tf.convert_to_tensor(iterations()), scale)
        if check is None or compiled_whole:
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
    rows = tf.stack([_local_summary(grads, None, tf.constant(0))
                     for grads in per_replica])
    total = len([g for g in per_replica[0] if g is not None])
    return tf.group(*_writes(variables, _first_bad_row(rows), total, step,
                             scale))


def read(variables: RecordVariables, names: Sequence[str],
         worker_of: Optional[Callable[[int], Optional[int]]] = None,
         ordered: bool = False) -> Optional[SkipRecord]:
    """The last skipped step, or None if none was (one host read).

    `ordered`: whether the step that wrote it recorded in backpropagation
    order (its `ranks` were known)."""
    step, streak, first_step, facts = [
        tf.convert_to_tensor(v).numpy() for v in variables]
    if int(step) < 0:
        return None

    def fact(key: str) -> int:
        return int(facts[_FACTS[key].start])

    chosen = [(int(i), int(k)) for i, k in zip(facts[_FACTS["indices"]],
                                               facts[_FACTS["kinds"]])
              if i >= 0]

    def name(i: int) -> str:
        return names[i] if i < len(names) else f"#{i}"

    return SkipRecord(
        step=int(step), scale=float(facts[_FACTS["scale"].start]),
        count=fact("count"), total=fact("total"),
        names=tuple(name(i) for i, _ in chosen),
        kinds=tuple(_KIND_TEXT.get(k, "NaN") for _, k in chosen),
        replica=fact("replica"), replicas=fact("replicas"),
        streak=int(streak), first_step=int(first_step),
        worker=None if worker_of is None else worker_of(fact("replica")),
        order="backprop" if ordered else "variable",
        farthest=name(fact("farthest")) if fact("farthest") >= 0 else None,
        loss=_LOSS_TEXT.get(fact("loss")))
