"""Calls whose arguments or meaning changed.

- `LossScaleOptimizer(opt, loss_scale=...)`, experimental or not: the loss
  scale becomes `dynamic`/`initial_scale`/`dynamic_growth_steps`
  (`loss_scale_args`); an experimental one (or the graph rewrite's wrapper
  of a Keras optimizer) on which the module calls no scaling method becomes
  `tf_lossscale.experimental.LossScaleOptimizer`, TF 2.4's class, which
  applies gradients given without scaling calls as unscaled, as the legacy
  one did (the current class would take them as scaled on Keras 3); one
  whose module may apply gradients that no scaling call marked (applied in
  a function apart from the scaling calls, as accumulating trainers do)
  becomes `tf_lossscale.compat.LossScaleOptimizer`, TF 2.4-2.15's class;
- `Policy(name, loss_scale=...)`: the loss scale moves to the optimizers
  `compile` wraps;
- `enable_mixed_precision_graph_rewrite(opt, loss_scale)`: the wrapper TF
  chose for `opt` (`tf_lossscale.LossScaleOptimizer` for a Keras optimizer,
  `tf_lossscale.MixedPrecisionLossScaleOptimizer` for a `tf.compat.v1` one),
  and a statement before it that turns on TensorFlow's `auto_mixed_precision`
  graph rewrite; `disable_...` turns it off;
- `model.compile(optimizer=...)` in a module that sets a loss-scaling
  policy: the optimizer that compile wrapped implicitly is wrapped
  explicitly.

A call that cannot be converted is kept (the experimental optimizer as
tf_lossscale's own deprecated one, which runs) and noted.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import libcst as cst

from tf_lossscale.compat import legacy_names as table
from tf_lossscale.compat.rewrite import loss_scale_args
from tf_lossscale.compat.rewrite.context import Context
from tf_lossscale.compat.rewrite.facts import Kind, Scaling
from tf_lossscale.compat.rewrite.syntax import (
    Unconvertible,
    bind,
    code,
    dotted,
    kwarg,
    literal,
    separated,
    short,
)

__all__ = ["mark_handled", "rewrite_call"]

_EXPERIMENTAL = "tensorflow.keras.mixed_precision.experimental."
_EXPERIMENTAL_OPTIMIZER = _EXPERIMENTAL + "LossScaleOptimizer"
_CURRENT_OPTIMIZER = "tensorflow.keras.mixed_precision.LossScaleOptimizer"
_LEGACY_POLICY = _EXPERIMENTAL + "Policy"
_OPTIMIZER = "tf_lossscale.LossScaleOptimizer"
_V1_OPTIMIZER = "tf_lossscale.MixedPrecisionLossScaleOptimizer"
# TF 2.4's class, which takes gradients applied with neither scaling call as
# unscaled, as TF 2.1-2.4 did; what the shim binds the legacy name to.
_DEPRECATED = "tf_lossscale.experimental.LossScaleOptimizer"
_AMP_OPTION = "config.optimizer.set_experimental_options"
# TF 2.4-2.15's current class, with that version's rule for gradients no
# scaling call marked (as given); what the shim binds that name to.
_TF24_OPTIMIZER = "tf_lossscale.compat.LossScaleOptimizer"


def mark_handled(ctx: Context, node: cst.Call) -> None:
    """Before the arguments are visited: claims a call rewritten whole (its
    function's dotted name, prefixes included)."""
    if ctx.name_of(node.func) in table.GRAPH_REWRITE:
        func: cst.BaseExpression = node.func
        while isinstance(func, cst.Attribute):
            ctx.handle(func)
            func = func.value
        ctx.handle(func)


def rewrite_call(ctx: Context, original: cst.Call,
                 updated: cst.Call) -> cst.BaseExpression:
    """The call, rewritten if a rule applies to it."""
    name = ctx.name_of(original.func)
    try:
        if name == _EXPERIMENTAL_OPTIMIZER:
            if not ctx.facts.scaling_seen(original):
                return updated.with_changes(func=dotted(_DEPRECATED))
            return _current_or_tf24(ctx, original, _optimizer(
                ctx, original, updated, ("optimizer",)))
        if name == _CURRENT_OPTIMIZER:
            return _current_or_tf24(ctx, original, _optimizer(
                ctx, original, updated, ("inner_optimizer",)))
        if name == _LEGACY_POLICY:
            return _policy(ctx, original, updated)
        if name in table.GRAPH_REWRITE:
            return _graph_rewrite(ctx, original, updated,
                                  table.GRAPH_REWRITE[name])
        if name is None and _is_method(original, "compile"):
            return _compile(ctx, original, updated)
    except Unconvertible as e:
        return _left(ctx, original, updated, name or "", str(e))
    return updated


def _current_or_tf24(ctx: Context, original: cst.Call,
                     converted: cst.Call) -> cst.Call:
    """`converted` (the current class), or TF 2.4-2.15's class with the
    same arguments where gradients no scaling call marked may reach its
    `apply_gradients`.

    TF 2.4-2.15's class (what the shim binds the name to) applies them as
    given, always; the current one takes them as scaled until
    `get_unscaled_gradients` has first run, which a `tf.function` traced
    before cannot know. Where the module applies no gradients, `fit` marks
    its own and the current class trains alike; where every
    `apply_gradients` follows a scaling call in its function, so does it.
    """
    if not ctx.facts.applies_gradients() or (
            ctx.facts.scaling_seen(original)
            and not ctx.facts.applies_unmarked(original)):
        return converted
    ctx.facts.imports_needed.add("tf_lossscale.compat")
    return converted.with_changes(func=dotted(_TF24_OPTIMIZER))


def _is_method(call: cst.Call, method: str) -> bool:
    return isinstance(call.func, cst.Attribute) and (
        call.func.attr.value == method)


def _left(ctx: Context, original: cst.Call, updated: cst.Call, name: str,
          why: str) -> cst.Call:
    """Keeps a call the rewriter cannot convert, and notes why.

    The experimental optimizer becomes tf_lossscale's own deprecated one,
    which takes `loss_scale=` and runs today; the graph rewrite becomes the
    function the shim binds, which takes the loss scales converted
    elsewhere (never half a conversion).
    """
    why = why.rstrip(".")
    if name == _EXPERIMENTAL_OPTIMIZER:
        ctx.note(original, f"{short(name)}: {why}; left as {_DEPRECATED}")
        return updated.with_changes(func=dotted(_DEPRECATED))
    if name in table.GRAPH_REWRITE:
        # TensorFlow's own function (where it still exists) refuses the
        # loss scales the name rule converted on other lines: call the one
        # the shim binds, which takes them and chooses as TF chose.
        shim = table.LEGACY_NAMES[name].shim
        ctx.facts.imports_needed.add(shim.rsplit(".", 1)[0])
        ctx.note(original, f"{short(name)}: {why}; left as {shim}")
        return updated.with_changes(func=dotted(shim))
    what = short(name) if name else code(original.func)
    ctx.note(original, f"{what}: {why}; left unchanged")
    # In its legacy spelling: a legacy Policy(..., loss_scale=) still runs
    # under the shim, a current one nowhere.
    return updated.with_changes(func=original.func)


# LossScaleOptimizer(opt, loss_scale).

def _optimizer(ctx: Context, original: cst.Call, updated: cst.Call,
               first: Tuple[str]) -> cst.Call:
    """`loss_scale=` (or TF 2.3's positional one) as current arguments."""
    current = first == ("inner_optimizer",)
    params = first + ("loss_scale",)
    if current and not _has_legacy_loss_scale(original):
        return updated  # Already current: the name rule renames it.
    bound = bind(original.args, params, "LossScaleOptimizer")
    args = []
    if first[0] in bound:
        arg = updated.args[bound[first[0]]]
        if arg.keyword:
            arg = arg.with_changes(keyword=cst.Name("inner_optimizer"))
        args.append(arg)
    if "loss_scale" in bound:
        i = bound["loss_scale"]
        args += loss_scale_args.optimizer_args(
            original.args[i].value, updated.args[i].value, ctx.name_of)
    if not args:
        return updated
    return updated.with_changes(args=separated(
        args, updated.args[0].comma, updated.args[-1].comma))


def _has_legacy_loss_scale(call: cst.Call) -> bool:
    """`loss_scale=`, or a second positional argument that is no bool."""
    for i, arg in enumerate(call.args):
        if arg.keyword is not None and arg.keyword.value == "loss_scale":
            return True
        if i == 1 and arg.keyword is None and not arg.star:
            try:
                return not isinstance(literal(arg.value), bool)
            except Unconvertible:
                return False
    return False


# Policy(name, loss_scale).

def _policy(ctx: Context, original: cst.Call, updated: cst.Call) -> cst.Call:
    """Drops a `loss_scale` that the compile rule carries, or notes it."""
    bound = bind(original.args, ("name", "loss_scale"), "Policy")
    if "loss_scale" not in bound:
        return updated
    why = ("the current Policy takes no loss scale: drop loss_scale and "
           "pass tf_lossscale.LossScaleOptimizer(optimizer, ...) to compile")
    if not _loss_scale_is_carried(ctx, original, bound):
        raise Unconvertible(why)
    args = [a for i, a in enumerate(updated.args)
            if i != bound["loss_scale"]]
    args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return updated.with_changes(args=args)


def _loss_scale_is_carried(ctx: Context, original: cst.Call,
                           bound: Dict[str, int]) -> bool:
    """True if dropping the policy's loss scale loses nothing.

    It is "auto" or the policy's default, or this policy is the one the
    module sets and the compile rule wraps the optimizers of the module's
    own `compile` calls with its scale (with no compile here, the scale
    would be lost: reported).
    """
    try:
        policy = literal(original.args[bound["name"]].value)
        loss_scale = literal(original.args[bound["loss_scale"]].value)
        if loss_scale in ("auto",
                          table.default_policy_loss_scale(policy)):
            return True
    except (KeyError, Unconvertible):
        pass
    scaling = ctx.facts.compile_scaling()
    # Only where a compile of the run carries it: this module's, or that of
    # another module of the run without a policy of its own, which is
    # wrapped with this scaling; a compile outside the run would wrap with
    # Keras' dynamic default instead.
    run = ctx.facts.run
    return id(original) in ctx.facts.scaling_sources and isinstance(
        scaling, tuple) and (ctx.facts.compiles() or (
            run.compiles and run.scaling == scaling))


# enable_/disable_mixed_precision_graph_rewrite.

def _graph_rewrite(ctx: Context, original: cst.Call, updated: cst.Call,
                   enable: bool) -> cst.BaseExpression:
    option = cst.parse_expression(
        f"{ctx.facts.reference(_AMP_OPTION)}"
        f"({{'auto_mixed_precision': {enable}}})")
    if not enable:
        return option
    bound = bind(original.args, ("opt", "loss_scale"),
                 "enable_mixed_precision_graph_rewrite")
    if "opt" not in bound:
        raise Unconvertible("enable_mixed_precision_graph_rewrite is "
                            "called without an optimizer")
    wrapped = _rewrite_wrapper(ctx, original, updated, bound)
    if not ctx.add_statement_before(code(option)):
        raise Unconvertible(
            "the call is not inside a simple statement, so the rewriter "
            f"has nowhere to put {code(option)}; move it to a line of its "
            "own")
    return wrapped


def _rewrite_wrapper(ctx: Context, original: cst.Call, updated: cst.Call,
                     bound: Dict[str, int]) -> cst.Call:
    """The optimizer TF's graph rewrite wrapped `opt` in."""
    opt = updated.args[bound["opt"]].value
    kind = ctx.facts.kind(original.args[bound["opt"]].value)
    i = bound.get("loss_scale")
    if kind is Kind.KERAS_OPTIMIZER and not ctx.facts.scaling_seen(original):
        loss_scale = (updated.args[i].value if i is not None
                      else cst.SimpleString("'dynamic'"))
        return _call(_DEPRECATED, [cst.Arg(opt), cst.Arg(loss_scale)])
    if kind is Kind.KERAS_OPTIMIZER:
        extra = [] if i is None else loss_scale_args.optimizer_args(
            original.args[i].value, updated.args[i].value, ctx.name_of)
        return _current_or_tf24(ctx, original,
                                _call(_OPTIMIZER, [cst.Arg(opt), *extra]))
    if kind is Kind.V1_OPTIMIZER:
        loss_scale = (updated.args[i].value if i is not None
                      else cst.SimpleString("'dynamic'"))
        return _call(_V1_OPTIMIZER, [cst.Arg(opt), cst.Arg(loss_scale)])
    raise Unconvertible(
        f"the rewriter cannot tell whether {code(opt)} is a Keras optimizer "
        f"(then write {_OPTIMIZER}(opt, ...)) or a tf.compat.v1 one (then "
        f"{_V1_OPTIMIZER}(opt, loss_scale)); TF chose by its type. Wrap it "
        f"by hand and call tf.{_AMP_OPTION}({{'auto_mixed_precision': "
        "True}) before")


def _call(func: str, args: List[cst.Arg]) -> cst.Call:
    return cst.Call(func=dotted(func), args=separated(
        args, cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")),
        cst.MaybeSentinel.DEFAULT))


# model.compile(optimizer=...) under a loss-scaling policy.

def _compile(ctx: Context, original: cst.Call, updated: cst.Call) -> cst.Call:
    """Wraps compile's optimizer as compile itself did under the policy."""
    scaling = ctx.facts.compile_scaling()
    if scaling is Scaling.NONE:
        return updated
    if scaling is Scaling.UNSCALED_MIXED:
        raise Unconvertible(
            "under Policy('mixed_float16', loss_scale=None) TF 2.1-2.3's "
            "compile did not scale the loss and the current one does: pass "
            "auto_scale_loss=False to compile (Keras 3)")
    if scaling is Scaling.UNKNOWN and ctx.facts.scaling_elsewhere:
        _note_model_scaling_calls(ctx)
        raise Unconvertible(
            "this module sets no policy, and the other modules of this run "
            "set policies that scale differently (or that the rewriter "
            "cannot read): it cannot tell which one this compile runs "
            "under; compile wrapped the optimizer in a LossScaleOptimizer "
            f"under mixed_float16: wrap it in {_OPTIMIZER} by hand where it "
            "did")
    if scaling is Scaling.UNKNOWN:
        _note_model_scaling_calls(ctx)
        raise Unconvertible(
            "the rewriter cannot tell which policy this compile runs under "
            "(the module sets a policy it cannot read, or several that "
            "scale differently); compile wrapped the optimizer in a "
            "LossScaleOptimizer under mixed_float16: wrap it in "
            f"{_OPTIMIZER} by hand where it did")
    if ctx.compile_overrides and not _is_super_call(original):
        _note_model_scaling_calls(ctx)
        raise Unconvertible(
            "the module defines its own compile (class "
            f"{', '.join(ctx.compile_overrides)}), and the rewriter cannot "
            "tell whether this call reaches it or Keras' compile, which "
            "wrapped the optimizer in a LossScaleOptimizer under the policy; "
            f"wrap it in {_OPTIMIZER} by hand where Keras' compile did")
    extra = ([] if scaling is Scaling.IF_MIXED_FLOAT16 else
             [kwarg(k, cst.parse_expression(v)) for k, v in scaling])
    index = _optimizer_index(original)
    if index is None:
        return _with_default_optimizer(ctx, updated, extra, scaling)
    value = original.args[index].value
    if isinstance(value, cst.IfExp) and any(
            ctx.facts.kind(branch) in (Kind.LOSS_SCALE_OPTIMIZER,
                                       Kind.EXPERIMENTAL_OPTIMIZER)
            for branch in _branches(value)):
        return updated  # Wrapped where the policy scales (migrated code).
    wrapped = _wrapped(ctx, updated.args[index].value, ctx.facts.kind(value),
                       extra)
    if wrapped is None:
        return updated
    wrapped = _if_mixed(ctx, wrapped, updated.args[index].value, scaling)
    args = list(updated.args)
    args[index] = args[index].with_changes(value=wrapped)
    return updated.with_changes(args=args)


def _branches(node: cst.IfExp) -> List[cst.BaseExpression]:
    """The values a conditional expression may take, nested ones too
    (migrate's own `x if isinstance(x, W) else W(x) if mixed else x`)."""
    found: List[cst.BaseExpression] = []
    for branch in (node.body, node.orelse):
        found += _branches(branch) if isinstance(branch, cst.IfExp) else [
            branch]
    return found


def _if_mixed(ctx: Context, wrapped: cst.BaseExpression,
              unwrapped: cst.BaseExpression,
              scaling: object) -> cst.BaseExpression:
    """`wrapped`, or, for a policy chosen at run time (or set by another
    module of the run, which may not run first), `wrapped` only if the
    global policy is mixed_float16, as compile chose."""
    if scaling is not Scaling.IF_MIXED_FLOAT16 and (
            not ctx.facts.scaling_elsewhere):
        return wrapped
    policy = ctx.facts.reference("keras.mixed_precision.global_policy")
    test = cst.parse_expression(f"{policy}().name == 'mixed_float16'")
    return cst.IfExp(test=test, body=wrapped, orelse=unwrapped)


def _note_model_scaling_calls(ctx: Context) -> None:
    """Names each line that calls a loss-scale optimizer's method on a
    model's optimizer: with compile's wrapper left out, Keras 3's compile
    wraps in its own class, which has none of them (they fail there)."""
    if ctx.model_scaling_noted:
        return
    ctx.model_scaling_noted = True
    for call in ctx.facts.model_optimizer_scaling_calls():
        assert isinstance(call.func, cst.Attribute)
        ctx.note(call, f"{code(call.func)}: the optimizer of a model whose "
                 "compile is left unconverted (see its line) is Keras' own "
                 "LossScaleOptimizer on Keras 3, which has no "
                 f"{call.func.attr.value}; this fails there until that "
                 "compile passes a tf_lossscale.LossScaleOptimizer")


def _is_super_call(call: cst.Call) -> bool:
    """`super().compile(...)` or `super(Cls, self).compile(...)`."""
    receiver = call.func.value if isinstance(call.func, cst.Attribute) else None
    return (isinstance(receiver, cst.Call)
            and isinstance(receiver.func, cst.Name)
            and receiver.func.value == "super")


def _with_default_optimizer(ctx: Context, updated: cst.Call,
                            extra: List[cst.Arg],
                            scaling: object) -> cst.Call:
    """compile(...) without an optimizer: its default, "rmsprop", wrapped."""
    rmsprop = cst.SimpleString("'rmsprop'")
    default = _if_mixed(ctx, _wrap(ctx, rmsprop, Kind.STRING, extra),
                        rmsprop, scaling)
    args = list(updated.args)
    if args:
        args[-1] = args[-1].with_changes(comma=cst.Comma(
            whitespace_after=cst.SimpleWhitespace(" ")))
    return updated.with_changes(args=[*args, kwarg("optimizer", default)])


def _optimizer_index(call: cst.Call) -> Optional[int]:
    """Where compile's `optimizer` argument is; None if it is not given."""
    for i, arg in enumerate(call.args):
        if arg.star:
            raise Unconvertible("compile is called with *args or **kwargs, "
                                "so the rewriter cannot find its optimizer")
        if (arg.keyword is None and i == 0) or (
                arg.keyword is not None and arg.keyword.value == "optimizer"):
            return i
    return None


def _wrapped(ctx: Context, value: cst.BaseExpression, kind: Kind,
             extra: List[cst.Arg]) -> Optional[cst.BaseExpression]:
    """`value` wrapped as compile wrapped it; None if compile did not."""
    if kind in (Kind.LOSS_SCALE_OPTIMIZER, Kind.EXPERIMENTAL_OPTIMIZER,
                Kind.V1_OPTIMIZER):
        return None
    return _wrap(ctx, value, kind, extra)


def _wrap(ctx: Context, value: cst.BaseExpression, kind: Kind,
          extra: List[cst.Arg]) -> cst.BaseExpression:
    """`value` (an optimizer, a name of one, or either) in our wrapper."""
    wrapper, extra = _compile_wrapper(ctx, extra)
    if kind is Kind.KERAS_OPTIMIZER:
        return _call(wrapper, [cst.Arg(value), *extra])
    get = f"{ctx.facts.reference('keras.optimizers.get')}"
    resolved = _call(get, [cst.Arg(value)])
    if kind is Kind.STRING:
        return _call(wrapper, [cst.Arg(resolved), *extra])
    if not isinstance(value, (cst.Name, cst.Attribute)):
        raise Unconvertible(
            f"the rewriter cannot tell whether {code(value)} is already a "
            "LossScaleOptimizer, which compile kept, or an optimizer, which "
            f"it wrapped: wrap it in {_OPTIMIZER} by hand if it is not one")
    # Either, at run time: keep a loss-scale optimizer, wrap anything else.
    check = cst.parse_expression(f"isinstance({code(value)}, {_OPTIMIZER})")
    return cst.IfExp(test=check, body=value,
                     orelse=_call(wrapper, [cst.Arg(resolved), *extra]))


def _compile_wrapper(ctx: Context, extra: List[cst.Arg]
                     ) -> Tuple[str, List[cst.Arg]]:
    """The class compile wrapped in, and its arguments after the optimizer.

    Under a TF 2.1-2.3 policy (`mixed_precision.experimental.set_policy`)
    compile wrapped in TF 2.1-2.3's class, which the shim runs as TF 2.4's
    (`tf_lossscale.experimental.LossScaleOptimizer`): it applies gradients
    given without scaling calls (a custom `train_step`) as given, where the
    current class would take them as scaled. Its `loss_scale` is "dynamic"
    or the fixed scale; any other scaling keeps the current class.

    So did TF 2.4-2.15's compile where the module's model has a
    `train_step` of its own that calls no scaling method on its optimizer
    (the "Customizing what happens in fit" guide's): TF 2.4-2.15's class
    applied those gradients as given, as TF 2.4's class here does, where
    Keras 3's rule (the current class) takes them as scaled.
    """
    if not ctx.facts.sets_legacy_policy() and not (
            ctx.train_steps
            and not ctx.facts.model_optimizer_scaling_calls()):
        return _OPTIMIZER, extra
    given = {code(a.keyword): code(a.value) for a in extra
             if a.keyword is not None}
    if not given:
        return _DEPRECATED, [cst.Arg(cst.SimpleString("'dynamic'"))]
    if set(given) == {"dynamic", "initial_scale"} and (
            given["dynamic"] == "False"):
        return _DEPRECATED, [cst.Arg(cst.parse_expression(
            given["initial_scale"]))]
    return _OPTIMIZER, extra
