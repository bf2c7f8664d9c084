"""`x.loss_scale`: what it meant in TF 2.1-2.3, and what it means now.

In TF 2.1-2.3 an experimental `LossScaleOptimizer`'s `loss_scale`, and a
`Policy`'s, was a `LossScale` object: `optimizer.loss_scale()` read the
current scale, `print(optimizer.loss_scale)` showed `DynamicLossScale(...)`.
Today an optimizer's `loss_scale` is the current scale itself (a tensor) and
a policy has none. So:

- `optimizer.loss_scale()` becomes `optimizer.loss_scale` where `optimizer`
  is known to be a loss-scale optimizer (or is a model's `.optimizer`);
- every other `.loss_scale()`, every read of a policy's `loss_scale` (or
  of what may be one: a name that says policy, of a kind the rewriter cannot
  tell) and every other read of an experimental optimizer's is reported.
"""

from __future__ import annotations

import libcst as cst

from tf_lossscale.compat.rewrite.context import Context
from tf_lossscale.compat.rewrite.facts import Kind
from tf_lossscale.compat.rewrite.syntax import code

__all__ = ["is_loss_scale_call", "rewrite_call", "check_read"]

_POLICY = ("{} is a dtype policy's loss scale, which the current Policy "
           "does not have: the loss scale is the optimizer's now (read "
           "optimizer.loss_scale, a tensor); rewrite this by hand")


def is_loss_scale_call(node: cst.Call) -> bool:
    """True for `<expr>.loss_scale()`."""
    return (isinstance(node.func, cst.Attribute)
            and node.func.attr.value == "loss_scale" and not node.args)


def rewrite_call(ctx: Context, original: cst.Call,
                 updated: cst.Call) -> cst.BaseExpression:
    """`optimizer.loss_scale()` -> `optimizer.loss_scale`, or a note."""
    assert isinstance(original.func, cst.Attribute)
    receiver = original.func.value
    if ctx.facts.is_loss_scale_optimizer(receiver):
        return updated.func
    if ctx.facts.may_be_policy(receiver):
        ctx.note(original, _POLICY.format(code(original)))
    else:
        ctx.note(original, f"{code(original)}: the rewriter cannot tell "
                 f"whether {code(receiver)} is a LossScaleOptimizer (whose "
                 "loss_scale is the current scale, a tensor, now) or a "
                 "LossScale; rewrite this by hand")
    return updated


def check_read(ctx: Context, original: cst.Attribute) -> None:
    """Notes a read of `x.loss_scale` that means something else now."""
    if original.attr.value != "loss_scale" or not ctx.is_read(original):
        return
    if ctx.facts.may_be_policy(original.value):
        ctx.note(original, _POLICY.format(code(original)))
    elif "policy" in code(original.value).lower() and (
            ctx.facts.kind(original.value) is Kind.UNKNOWN):
        # `policy = build_policy(flags)`, `self.policy` set elsewhere: a
        # name that says policy, of a kind the rewriter cannot tell.
        ctx.note(original, f"{code(original)}: the rewriter cannot tell "
                 f"whether {code(original.value)} is a dtype policy (whose "
                 "loss_scale the current Policy does not have) or a "
                 "loss-scale optimizer; rewrite this by hand")
    elif ctx.facts.may_be_experimental(original.value):
        ctx.note(original, f"{code(original)} was a LossScale object "
                 "(callable, printed as DynamicLossScale(...)); it is the "
                 "current scale, a float32 tensor, now; rewrite this use by "
                 "hand")
