"""What every rewriting rule is handed: names, notes, facts, statements."""

from __future__ import annotations

from typing import Callable, List, Mapping, Optional, Set

import libcst as cst
from libcst.metadata import CodeRange

from tf_lossscale.compat import legacy_names as table
from tf_lossscale.compat.rewrite.facts import Facts, collect
from tf_lossscale.compat.rewrite.syntax import Note

__all__ = ["Context", "Positions"]

# The positions of the module's nodes, resolved (once) on the first note:
# most modules get none, and resolving them is a pass over the whole tree.
Positions = Callable[[], Mapping[cst.CSTNode, CodeRange]]


class Context:
    """One module's rewriting state, shared by the rules.

    Args:
      module: the module as parsed (the rules see its nodes as `original`).
      positions: where each of its nodes is.
    """

    def __init__(self, module: cst.Module, positions: Positions) -> None:
        self._positions = positions
        self.notes: List[Note] = []
        self._syntax = collect(module)
        self.facts = Facts(self._syntax, self.name_of)
        # Classes of this module with a `compile` of their own.
        self.compile_overrides: List[str] = [
            node.name.value for node in module.body
            if isinstance(node, cst.ClassDef) and any(
                isinstance(item, cst.FunctionDef)
                and item.name.value == "compile"
                for item in node.body.body)]
        # Classes of this module with a `train_step` of their own.
        self.train_steps: List[str] = [
            node.name.value for node in module.body
            if isinstance(node, cst.ClassDef) and any(
                isinstance(item, cst.FunctionDef)
                and item.name.value == "train_step"
                for item in node.body.body)]
        self._handled: Set[int] = set()
        # ids of the functions of calls (`f` in `f(...)`), as parsed.
        self.called: Set[int] = set()
        # ids of the classes `isinstance`/`issubclass` test against.
        self.tested: Set[int] = set()
        # Whether the lines a left compile makes fail are named already.
        self.model_scaling_noted = False
        self._statements: List[List[cst.BaseStatement]] = []

    def name_of(self, node: cst.CSTNode) -> Optional[str]:
        """The imported name `node` refers to, e.g. tensorflow.train.x, in
        the spelling of the legacy table (`legacy_names.canonical`)."""
        name = self._syntax.qualified_name(node)
        return None if name is None else table.canonical(name)

    def is_read(self, node: cst.CSTNode) -> bool:
        """False for an assignment target or a `del`."""
        return id(node) not in self._syntax.stores

    def note(self, node: cst.CSTNode, reason: str) -> None:
        """Records that `node`'s line was left unconverted, and why."""
        line = self._positions()[node].start.line
        # One line of report: code quoted in the reason may span several.
        self.notes.append(Note(line, " ".join(reason.split())))

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
