"""What every rewriting rule is handed: names, notes, facts, statements."""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Set

import libcst as cst
from libcst.metadata import (
    ExpressionContext,
    ExpressionContextProvider,
    PositionProvider,
    QualifiedNameProvider,
    QualifiedNameSource,
)

from tf_lossscale.compat import legacy_names as table
from tf_lossscale.compat.rewrite.facts import Facts, collect
from tf_lossscale.compat.rewrite.syntax import Note

__all__ = ["Context", "METADATA"]

# The metadata the rules read, resolved once per module.
METADATA = (QualifiedNameProvider, PositionProvider, ExpressionContextProvider)

GetMetadata = Callable[..., Any]


class Context:
    """One module's rewriting state, shared by the rules.

    Args:
      module: the module as parsed (the rules see its nodes as `original`).
      get_metadata: the transformer's `get_metadata`.
    """

    def __init__(self, module: cst.Module, get_metadata: GetMetadata) -> None:
        self._get_metadata = get_metadata
        self.notes: List[Note] = []
        self.facts = Facts(collect(module), self.name_of)
        # Classes of this module with a `compile` of their own.
        self.compile_overrides: List[str] = [
            node.name.value for node in module.body
            if isinstance(node, cst.ClassDef) and any(
                isinstance(item, cst.FunctionDef)
                and item.name.value == "compile"
                for item in node.body.body)]
        self._handled: Set[int] = set()
        # Whether the lines a left compile makes fail are named already.
        self.model_scaling_noted = False
        self._statements: List[List[cst.BaseStatement]] = []

    def name_of(self, node: cst.CSTNode) -> Optional[str]:
        """The imported name `node` refers to, e.g. tensorflow.train.x, in
        the spelling of the legacy table (`legacy_names.canonical`)."""
        names = self._get_metadata(QualifiedNameProvider, node, set())
        for qualified in sorted(names, key=lambda q: q.name):
            if qualified.source is QualifiedNameSource.IMPORT:
                return table.canonical(qualified.name)
        return None

    def is_read(self, node: cst.CSTNode) -> bool:
        """False for an assignment target or a `del`."""
        return self._get_metadata(ExpressionContextProvider, node,
                                  ExpressionContext.LOAD) is (
            ExpressionContext.LOAD)

    def note(self, node: cst.CSTNode, reason: str) -> None:
        """Records that `node`'s line was left unconverted, and why."""
        line = self._get_metadata(PositionProvider, node).start.line
        self.notes.append(Note(line, reason))

    # Nodes a call rule rewrites whole, which the name rules then skip.

    def handle(self, node: cst.CSTNode) -> None:
        self._handled.add(id(node))

    def handled(self, node: cst.CSTNode) -> bool:
        return id(node) in self._handled

    # Statements a rule adds before the statement it is in.

    def enter_statement(self) -> None:
        self._statements.append([])

    def leave_statement(self) -> List[cst.BaseStatement]:
        """The statements to add before the statement being left."""
        return self._statements.pop()

    def add_statement_before(self, statement: str) -> bool:
        """Adds `statement` before the current simple statement line.

        Returns False (adding nothing) outside one, e.g. in an `if` header.
        """
        if not self._statements:
            return False
        self._statements[-1].append(cst.parse_statement(statement))
        return True
