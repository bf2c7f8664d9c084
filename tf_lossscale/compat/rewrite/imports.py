"""Imports: legacy modules and members are imported from where they live now.

`from tensorflow.keras.mixed_precision import experimental as mp` becomes
`from tensorflow.keras import mixed_precision as mp`; `from
tensorflow.train.experimental import DynamicLossScale` becomes `from
tf_lossscale import DynamicLossScale`; an import of a module whose members
all moved to tf_lossscale, or of a function whose calls are rewritten whole
(`enable_mixed_precision_graph_rewrite`), is dropped. Imports from the
private modules of TF 2.1-2.5 (`tensorflow.python.keras.mixed_precision...`)
become imports of the public module their members are spelt in now
(`legacy_names.ALIASES`).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import libcst as cst
from libcst.helpers import get_full_name_for_node

from tf_lossscale.compat import legacy_names as table
from tf_lossscale.compat.rewrite.context import Context
from tf_lossscale.compat.rewrite.syntax import dotted, short, split

__all__ = ["rewrite_line"]

Statements = List[cst.BaseSmallStatement]


def rewrite_line(ctx: Context, original: cst.SimpleStatementLine,
                 updated: cst.SimpleStatementLine
                 ) -> Sequence[cst.SimpleStatementLine]:
    """The line with its import statements rewritten: zero or more lines.

    One import per line stays one per line; statements sharing a line
    (`import a; import b`) keep sharing it.
    """
    body: Statements = []
    for statement in updated.body:
        if isinstance(statement, cst.Import):
            body += _import(statement)
        elif isinstance(statement, cst.ImportFrom):
            body += _import_from(ctx, original, statement)
        else:
            body.append(statement)
    if len(body) == len(updated.body) and all(
            a is b for a, b in zip(body, updated.body)):
        return [updated]
    if not body:
        return []
    if len(updated.body) == 1:
        return ([updated.with_changes(body=[body[0]])]
                + [cst.SimpleStatementLine(body=[s]) for s in body[1:]])
    return [updated.with_changes(body=[
        s.with_changes(semicolon=cst.MaybeSentinel.DEFAULT) for s in body])]


def _import(statement: cst.Import) -> Statements:
    """`import tensorflow.keras.mixed_precision.experimental as mp`."""
    names = []
    for alias in statement.names:
        raw = get_full_name_for_node(alias.name) or ""
        module = table.canonical(raw)
        moved = table.moved_module(raw)
        if module not in table.VANISHED_MODULES:
            if moved is not None and alias.asname is not None:
                alias = alias.with_changes(name=dotted(moved))
            names.append(alias)
            continue
        current = table.VANISHED_MODULES[module]
        if current is None and alias.asname is not None:
            continue  # Its members are spelt tf_lossscale.X now.
        names.append(alias.with_changes(
            name=dotted(current or module.split(".")[0])))
    if len(names) == len(statement.names) and all(
            a is b for a, b in zip(names, statement.names)):
        return [statement]
    if not names:
        return []
    names[-1] = names[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return [statement.with_changes(names=names)]


# New module -> [(member, alias or None)].
_Moved = Dict[str, List[Tuple[str, Optional[str]]]]


def _import_from(ctx: Context, line: cst.SimpleStatementLine,
                 statement: cst.ImportFrom) -> Statements:
    """`from M import a, b as c`: legacy members move to their modules."""
    if statement.relative or statement.module is None:
        return [statement]
    module = get_full_name_for_node(statement.module) or ""
    if isinstance(statement.names, cst.ImportStar):
        if table.canonical(module) in table.VANISHED_MODULES:
            ctx.note(line, f"from {short(module)} import *: name the members "
                     "instead, then migrate again")
        return [statement]
    kept: List[cst.ImportAlias] = []
    moved: _Moved = {}
    dropped = False
    for alias in statement.names:
        member = get_full_name_for_node(alias.name) or ""
        raw = f"{module}.{member}"
        name = table.canonical(raw)
        asname = _asname(alias)
        if asname is None and split(name)[1] != member:
            asname = member  # The name the module binds stays bound.
        target = _new_home(name, asname)
        public = table.moved_module(raw)
        if target is None and public is not None:
            target = (*split(public), asname or member)
        if target is None:  # Not legacy: stays.
            if table.canonical(module) in table.VANISHED_MODULES:
                ctx.note(line, f"{short(name)} has no current equivalent in "
                         "the migration table; rewrite it by hand")
            kept.append(alias)
        elif target == _DROPPED:
            dropped = True
        else:
            new_module, member, asname = target
            moved.setdefault(new_module, []).append((member, asname))
    if not moved and not dropped:
        return [statement]
    return _from_statements(statement, kept, moved)


_DROPPED = ("", "", None)


def _asname(alias: cst.ImportAlias) -> Optional[str]:
    if isinstance(alias.asname, cst.AsName) and isinstance(
            alias.asname.name, cst.Name):
        return alias.asname.name.value
    return None


def _new_home(name: str, asname: Optional[str]
              ) -> Optional[Tuple[str, str, Optional[str]]]:
    """Where `from ... import <name> as <asname>` imports from now.

    (module, member, alias); `_DROPPED` when the import goes (a module whose
    members all moved to tf_lossscale, or a function rewritten call by
    call); None for a name that is not legacy.
    """
    if name in table.VANISHED_MODULES:
        current = table.VANISHED_MODULES[name]
        if current is None:
            return _DROPPED
        new_module, member = split(current)
        return new_module, member, asname or split(name)[1]
    if name in table.LEGACY_NAMES:
        current = table.LEGACY_NAMES[name].current
        if current is None:
            return _DROPPED
        new_module, member = split(current)
        return new_module, member, asname
    return None


def _from_statements(statement: cst.ImportFrom, kept: List[cst.ImportAlias],
                     moved: _Moved) -> Statements:
    statements: Statements = []
    if kept:
        kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        statements.append(statement.with_changes(names=kept))
    for new_module, members in moved.items():
        statements.append(cst.ImportFrom(
            module=dotted(new_module),
            names=[cst.ImportAlias(
                name=cst.Name(member),
                asname=cst.AsName(name=cst.Name(asname))
                if asname not in (None, member) else None)
                for member, asname in members]))
    return statements
