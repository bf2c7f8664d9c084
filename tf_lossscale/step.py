"""One loss-scaled step, and the thin variable shell around the rule.

`loss_scaled_step` is what every Keras flavour's `apply_gradients` calls,
read top to bottom::

    unscaled, finite = unscale and check (finite.py)
    finite = agree across replicas              (distribute.py)
    apply(unscaled) if finite else skip()       (distribute.py)
    advance the scale state                     (state_machine.py, below)

It is handed everything it needs: the inner optimizer's update (`apply`),
what a skipped step still does (`skip`: advance `iterations`), and the
variables. `advance` assigns the state that `state_machine.transition`
computes; `DynamicLossScale.update` uses it too.
"""

from __future__ import annotations

from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Tuple

import tensorflow as tf

from tf_lossscale import distribute, state_machine
from tf_lossscale import finite as finite_lib

__all__ = ["ScaleVariables", "advance", "loss_scaled_step"]


class ScaleVariables(NamedTuple):
    """The variables one loss scale keeps (None where a setting needs none).

    `scale` and `good_steps` are the dynamic state (None for a fixed
    scale), `bad_steps` exists only with hysteresis, and `skipped` is the
    telemetry counter (never in a checkpoint).
    """

    scale: Optional[tf.Variable] = None
    good_steps: Optional[tf.Variable] = None
    bad_steps: Optional[tf.Variable] = None
    skipped: Optional[tf.Variable] = None


def advance(variables: ScaleVariables, finite: tf.Tensor,
            rule: Optional[state_machine.Rule]) -> tf.Operation:
    """Assigns the state that follows a step; returns the assignments' op.

    Every write waits for every new value (so for every read): a TF1 graph
    orders nothing by itself, and no read may see a half-written state.
    With `rule=None` (a fixed scale) only `skipped` changes.
    """
    writes: List[Any] = []
    new_values: List[tf.Tensor] = []
    if rule is not None and variables.scale is not None:
        old = state_machine.State(
            _read(variables.scale), _read(variables.good_steps),
            0 if variables.bad_steps is None else _read(variables.bad_steps))
        new = state_machine.transition(old, finite, rule)
        pairs = [(variables.scale, new.scale),
                 (variables.good_steps, new.good_steps),
                 (variables.bad_steps, new.bad_steps)]
        writes += [(v, x) for v, x in pairs if v is not None]
        new_values += [x for _, x in writes]
    if variables.skipped is not None:
        skipped = _read(variables.skipped) + tf.cast(
            tf.logical_not(finite), tf.int64)
        writes.append((variables.skipped, skipped))
        new_values.append(skipped)
    with tf.control_dependencies(new_values):
        return tf.group(*[v.assign(x) for v, x in writes])


def _advance_once(variables: ScaleVariables, finite: tf.Tensor,
                  rule: Optional[state_machine.Rule]) -> Any:
    """`advance`, once per step even when the variables are not mirrored.

    An optimizer created outside `strategy.scope()` holds plain variables:
    every replica would assign them, so one agreed skip would back the
    scale off once per replica. Then the update is made once, from the
    cross-replica context (each worker holds its own copy). Decided at
    trace time; mirrored variables take the plain path.
    """
    context = tf.distribute.get_replica_context()
    plain = [v for v in variables if isinstance(v, tf.Variable)
             and not isinstance(v, tf.distribute.DistributedValues)]
    if (context is None or context.num_replicas_in_sync == 1 or not plain
            or tf.distribute.in_cross_replica_context()):
        return advance(variables, finite, rule)

    def once(strategy: tf.distribute.Strategy, verdict: Any) -> Any:
        # Every replica holds the same agreed verdict; read the first.
        first = strategy.experimental_local_results(verdict)[0]
        return advance(variables, first, rule)

    return context.merge_call(once, args=(finite,))


def _read(variable: Any) -> tf.Tensor:
    """The value of a tf.Variable or a Keras 3 variable (no `read_value`)."""
    return tf.convert_to_tensor(variable)


Checked = Tuple[List[Any], finite_lib.Verdict]


def _unscale_and_check(grads: List[Any], scale: tf.Tensor,
                       already_unscaled: bool,
                       keep: Optional[Sequence[bool]],
                       mode: finite_lib.Mode) -> Checked:
    """The gradients to apply, and whether all of them are finite."""
    if already_unscaled:
        return grads, finite_lib.check(grads, mode)
    if keep is None or not any(keep):
        return finite_lib.unscale_checked(grads, scale, mode)
    divided, finite = finite_lib.unscale_checked(
        [None if k else g for g, k in zip(grads, keep)], scale, mode)
    kept = finite_lib.check([g for g, k in zip(grads, keep) if k], mode)
    merged = [g if k else d for g, d, k in zip(grads, divided, keep)]
    return merged, finite_lib.Verdict(
        tf.logical_and(finite.finite, kept.finite))


def _check_scaled(grads: List[Any], scale: tf.Tensor,
                  keep: Optional[Sequence[bool]]) -> finite_lib.Verdict:
    """Whether the gradients to apply (divided, or kept) are all finite,
    compiled whole: with each present gradient's kind, in order."""
    whole = finite_lib.Mode.WHOLE
    if keep is None or not any(keep):
        return finite_lib.check_unscaled(grads, scale, whole)
    divided = finite_lib.check_unscaled(
        [None if k else g for g, k in zip(grads, keep)], scale, whole)
    kept = finite_lib.check(
        [g for g, k in zip(grads, keep) if k], whole)
    present = [k for g, k in zip(grads, keep) if g is not None]
    return finite_lib.Verdict(
        tf.logical_and(divided.finite, kept.finite),
        _in_order(present, divided.kinds, kept.kinds))


def _in_order(kept: List[bool], divided: Optional[tf.Tensor],
              others: Optional[tf.Tensor]) -> Optional[tf.Tensor]:
    """The kinds of the divided and the kept gradients, interleaved back
    into the gradients' order (`kept[i]`: whether the i-th is kept)."""
    if divided is None or others is None:
        return None
    n_divided = kept.count(False)
    counters = [0, 0]
    positions = []
    for k in kept:
        positions.append(n_divided + counters[1] if k else counters[0])
        counters[1 if k else 0] += 1
    return tf.gather(tf.concat([divided, others], 0), positions)


def _unscaling_first(apply: Callable[[List[Any]], Any], scale: tf.Tensor,
                    keep: Optional[Sequence[bool]], by_reciprocal: bool
                    ) -> Callable[[List[Any]], Any]:
    """`apply`, given scaled gradients: unscales (all but the kept) first,
    inside the apply branch of a caller compiled whole."""
    def unscale_then_apply(grads: List[Any]) -> None:
        flags = keep or [False] * len(grads)

        def merged(unscaled: List[Any]) -> Any:
            return apply([g if k else u
                          for g, u, k in zip(grads, unscaled, flags)])
        finite_lib.apply_unscaled(
            merged, [None if k else g for g, k in zip(grads, flags)], scale,
            by_reciprocal)
    return unscale_then_apply


Record = Callable[[List[Any], tf.Tensor, Optional[tf.Tensor], bool], Any]


def loss_scaled_step(
    grads: List[Any],
    *,
    scale: tf.Tensor,
    already_unscaled: bool,
    apply: Callable[[List[Any]], Any],
    skip: Callable[[], Any],
    variables: ScaleVariables,
    rule: Optional[state_machine.Rule],
    keep: Optional[Sequence[bool]] = None,
    verdict: Optional[tf.Tensor] = None,
    undivided: Optional[Callable[[List[Any]], Optional[
        Tuple[List[Any], Any]]]] = None,
    record: Optional[Record] = None,
    powers_of_two: bool = False,
) -> tf.Tensor:
    """Checks, agrees, applies or skips, and advances; in a replica context.

    The compile mode (`finite.compile_mode`) is decided once, here, and
    handed to the check and to `distribute.apply_or_skip`.

    Args:
      grads: the step's gradients (tensors, `tf.IndexedSlices` or None).
      scale: the current loss scale, which `grads` carry unless
        `already_unscaled`.
      already_unscaled: whether `grads` were divided by `scale` already.
      apply: the inner optimizer's update, given the unscaled gradients.
      skip: what a skipped step still does (advance `iterations`).
      variables: the loss scale's variables.
      rule: the dynamic rule, or None for a fixed scale.
      keep: per gradient, True where it is not a gradient to unscale but a
        value to apply as it is (Keras 3's `overwrite_with_gradient`
        variables); it is still checked.
      verdict: whether `grads` (already unscaled) are all finite, when
        that was computed as they were unscaled; else they are checked.
      undivided: given unscaled `grads`, what they are the quotients of
        (`(scaled, scale)`) when known (`GradientMarks`' `Taken.undivided`),
        else None.
      record: what a skipped step records about its gradients
        (`skip_record.recorder`), given them, `scale`, the kinds the check
        found (or None) and whether the step is compiled whole; it runs in
        the skip branch only, so a finite step pays nothing for it.
      powers_of_two: whether every scale the step can see is a power of
        two (`state_machine.powers_of_two_only`). Compiled whole by XLA,
        the update then multiplies by the reciprocal (the same bits as
        dividing, and not written out before Adam's two moments read it).

    Returns:
      The agreed verdict, a scalar bool tensor (True: applied). In a TF1
      graph, running it runs the step.
    """
    mode = finite_lib.compile_mode(
        [g for g in grads if isinstance(g, (tf.Tensor, tf.IndexedSlices))])
    whole = mode is finite_lib.Mode.WHOLE
    origin = undivided(grads) if (
        whole and already_unscaled and undivided is not None) else None
    if origin is not None:
        # Compiled whole by XLA, the documented flow: divide again inside
        # the apply branch, as the Keras 3 flow does (same values), and
        # check the quotients without writing them out.
        unscaled, found = origin[0], (
            finite_lib.check_unscaled(*origin, mode) if verdict is None
            else finite_lib.Verdict(verdict))
        apply = _unscaling_first(apply, origin[1], None, powers_of_two)
    elif already_unscaled and verdict is not None:
        unscaled, found = grads, finite_lib.Verdict(verdict)
    elif not already_unscaled and whole:
        # Compiled whole by XLA: check the scaled gradients now and divide
        # them inside the apply branch, where the division fuses into the
        # update instead of being written out before the branch.
        unscaled, found = grads, _check_scaled(grads, scale, keep)
        apply = _unscaling_first(apply, scale, keep, powers_of_two)
    else:
        unscaled, found = _unscale_and_check(
            grads, scale, already_unscaled, keep, mode)
    finite = distribute.agree(found.finite)
    # Another replica's kinds would be read through a closure: each
    # replica's record reads its own gradients instead.
    kinds = found.kinds if distribute.num_replicas() == 1 else None
    taken = distribute.apply_or_skip(
        finite, unscaled, apply, skip,
        None if record is None else lambda g: record(g, scale, kinds, whole),
        compiled_whole=whole)
    # Last, so that an inner optimizer that raises leaves the scale as it is.
    advanced = _advance_once(variables, finite, rule)
    if not tf.executing_eagerly() and not tf.inside_function():
        # A TF1 graph runs only what is fetched: the verdict carries the step
        # (tf_keras' legacy wrapper returns its train op from a graph).
        ops = [x for x in tf.nest.flatten(taken) + [advanced]
               if isinstance(x, (tf.Tensor, tf.Operation))]
        with tf.control_dependencies(ops):
            finite = tf.identity(finite)
    return finite
