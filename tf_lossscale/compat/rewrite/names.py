"""Names: a legacy name in an expression becomes its current spelling.

`tf.train.experimental.DynamicLossScale` becomes
`tf_lossscale.DynamicLossScale`; `mp.set_policy`, with `mp` an alias of the
vanished `tf.keras.mixed_precision.experimental`, becomes
`mp.set_global_policy` (the import rule rebinds `mp` to the current module).
The table is `legacy_names.LEGACY_NAMES`.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from tf_lossscale.compat import legacy_names as table
from tf_lossscale.compat.rewrite.context import Context
from tf_lossscale.compat.rewrite.syntax import dotted, short, split

__all__ = ["mark_prefixes", "rename_attribute", "rename_name"]


def _vanished(name: Optional[str]) -> Optional[str]:
    """The vanished legacy module `name` is in, or is, if any."""
    for module in table.VANISHED_MODULES:
        if name == module or (name or "").startswith(module + "."):
            return module
    return None


def _is_dotted(node: cst.BaseExpression) -> bool:
    """True for `a.b.c`; False for `a().b` (whose qualified name libcst
    spells as if the call were not there)."""
    while isinstance(node, cst.Attribute):
        node = node.value
    return isinstance(node, cst.Name)


def _legacy(name: Optional[str]) -> bool:
    """True for a legacy name, or a member of a vanished module."""
    return name in table.LEGACY_NAMES or bool(
        _vanished(name) and name not in table.VANISHED_MODULES)


def mark_prefixes(ctx: Context, node: cst.Attribute) -> None:
    """Marks the prefixes of a legacy dotted name (`tf.train` in
    `tf.train.experimental.X`), which are rewritten with the whole name."""
    if ctx.handled(node) or not _is_dotted(node) or not _legacy(
            ctx.name_of(node)):
        return
    value = node.value
    while isinstance(value, cst.Attribute):
        ctx.handle(value)
        value = value.value
    ctx.handle(value)


# TF 2.1-2.3's class: where it is called, the calls rule chooses between
# TF 2.4's class and the current one (they take unscaled gradients
# differently); anywhere else (a base class, isinstance, a variable holding
# the class) the rewriter cannot tell which was meant; in isinstance the
# current class, a base of both, answers as the legacy one did.
_EXPERIMENTAL_OPTIMIZER = (
    "tensorflow.keras.mixed_precision.experimental.LossScaleOptimizer")


def _uncalled_experimental(ctx: Context, original: cst.CSTNode,
                           name: Optional[str]) -> Optional[str]:
    """The shim's name for TF 2.1-2.3's class referred to, not called;
    the line is noted."""
    if name != _EXPERIMENTAL_OPTIMIZER or id(original) in ctx.called or (
            id(original) in ctx.tested):
        # Tested by isinstance: the current class, which TF 2.4's is a
        # subclass of, is true for either.
        return None
    shim = "tf_lossscale.experimental.LossScaleOptimizer"
    ctx.note(original, f"{short(name)} is used here, not called (a base "
             "class, a variable): written as " + shim + " (TF "
             "2.4's class, which applies gradients given without scaling "
             "calls as given); if the code scales the loss itself, "
             "tf_lossscale.LossScaleOptimizer is the current class")
    return shim


def _unreplaced(name: str) -> str:
    return (f"{short(name)} is converted only where it is called; rewrite "
            "this use by hand")


def rename_attribute(ctx: Context, original: cst.Attribute,
                     updated: cst.Attribute) -> cst.BaseExpression:
    """`prefix.member` for a legacy dotted name, in its current spelling."""
    if ctx.handled(original) or not _is_dotted(original):
        return updated
    name = ctx.name_of(original)
    shim = _uncalled_experimental(ctx, original, name)
    if shim is not None:
        return dotted(shim)
    if name in table.LEGACY_NAMES:
        current = table.LEGACY_NAMES[name].current
        if current is None:
            ctx.note(original, _unreplaced(name))
            return updated
        return _current_reference(updated, name, current)
    if name in table.VANISHED_MODULES:
        ctx.note(original, f"{short(name)}: the rewriter follows this legacy "
                 "module only where it is imported (import "
                 f"{name} as ...), not held in a variable; import it, then "
                 "migrate again")
    elif name and _vanished(name):
        ctx.note(original, f"{short(name)} has no current equivalent in "
                 "the migration table; rewrite it by hand")
    return updated


def _current_reference(updated: cst.Attribute, name: str,
                       current: str) -> cst.BaseExpression:
    legacy_module = split(name)[0]
    module, member = split(current)
    if module != table.VANISHED_MODULES.get(legacy_module):
        return dotted(current)
    prefix = updated.value
    if isinstance(prefix, cst.Attribute) and (
            prefix.attr.value == split(legacy_module)[1]):
        prefix = prefix.value  # tf.keras.mixed_precision.experimental
    # A Name prefix is an alias whose import now binds `module`.
    return updated.with_changes(value=prefix, attr=cst.Name(member))


def rename_name(ctx: Context, original: cst.Name,
                updated: cst.Name) -> cst.BaseExpression:
    """A bare legacy name (imported by `from ... import`), renamed."""
    if ctx.handled(original):
        return updated
    name = ctx.name_of(original)
    shim = _uncalled_experimental(ctx, original, name)
    if shim is not None:
        return dotted(shim)
    if name in table.LEGACY_NAMES:
        current = table.LEGACY_NAMES[name].current
        if current is None:
            ctx.note(original, _unreplaced(name))
            return updated
        if original.value == split(name)[1]:
            return updated.with_changes(value=split(current)[1])
        return updated  # Imported under an alias, which is kept.
    vanished = _vanished(name)
    if vanished and table.VANISHED_MODULES[vanished] is None:
        ctx.note(original, f"{original.value} refers to the legacy module "
                 f"{short(vanished)}, which has no current equivalent; "
                 "rewrite it by hand")
    return updated
