"""What every rewriting rule is handed: names, notes, facts, statements."""

from __future__ import annotations

from typing import Callable, List, Mapping, Optional, Set

import libcst as cst
from libcst.metadata import CodeRange

from tf_lossscale.compat import legacy_names as table
from tf_lossscale.compat.rewrite.compile_scaling import ALONE
from tf_lossscale.compat.rewrite.facts import Facts, Run, collect
from tf_lossscale.compat.rewrite.syntax import Note, code

__all__ = ["Context", "Positions"]

# Modules so common that a name imported as one of them (`tf`, `keras`)
# marks nothing by itself: every legacy name under them is reached through
# a word holding a `legacy_names.TEXT_NEEDLES` text (`mixed_precision`,
# `LossScaleOptimizer`, `DynamicLossScale`, ...).
_COMMON_MODULES = frozenset({
    "tensorflow", "tensorflow.keras", "tensorflow.compat",
    "tensorflow.compat.v1", "tensorflow.train", "tensorflow.compat.v1.train",
    "keras", "tf_keras", "tensorflow.python", "tensorflow.python.keras",
    "tensorflow.python.training"})
# Legacy names and modules, for the names imported as one of them, one
# inside one or one above one.
_LEGACY = frozenset([*table.LEGACY_NAMES, *table.VANISHED_MODULES])
# Methods and attributes a rule rewrites on any object.
_RULE_WORDS = frozenset({"compile", "loss_scale"})


def _imports(module: cst.Module) -> List[cst.CSTNode]:
    """The import statements of `module`, at any depth (statements only
    are searched, not expressions)."""
    found: List[cst.CSTNode] = []
    stack: List[cst.CSTNode] = [module]
    while stack:
        node = stack.pop()
        if isinstance(node, (cst.Import, cst.ImportFrom)):
            found.append(node)
            continue
        for field in ("body", "orelse", "handlers", "finalbody", "cases"):
            value = getattr(node, field, None)
            if isinstance(value, cst.CSTNode):
                stack.append(value)
            elif isinstance(value, (tuple, list)):
                stack.extend(v for v in value if isinstance(v, cst.CSTNode))
    return found


def _near_legacy(name: str) -> bool:
    """True for a legacy name, a module above one, or a name inside one."""
    name = table.canonical(name)
    return name not in _COMMON_MODULES and any(
        legacy == name or legacy.startswith(name + ".")
        or name.startswith(legacy + ".") for legacy in _LEGACY)


def _wanted(module: cst.Module) -> Callable[[str], bool]:
    """Which `Name` values a rule may act on, or on what they are part of.

    A rule acts only on a legacy name (found through the imported name it
    starts with), on `compile` and on `loss_scale`; a legacy name's
    spelling holds a word with a needle text of the prefilter, unless it
    starts with a name imported as a legacy module (`mp` in `mp.X` after
    `from tensorflow.keras.mixed_precision import experimental as mp`):
    those names are wanted too. Everything else the transformer skips;
    `Facts` still reads the whole module.
    """
    aliases: Set[str] = set()
    for node in _imports(module):
        if isinstance(node, cst.Import):
            for alias in node.names:
                full = code(alias.name)
                if alias.asname is not None and _near_legacy(full):
                    aliases.add(code(alias.asname.name))
                elif alias.asname is None:
                    head = full.split(".")[0]
                    if _near_legacy(head):
                        aliases.add(head)
        elif isinstance(node, cst.ImportFrom) and node.module is not None \
                and not isinstance(node.names, cst.ImportStar):
            base = ("." * len(node.relative)) + code(node.module)
            for alias in node.names:
                full = f"{base}.{code(alias.name)}"
                if _near_legacy(full):
                    aliases.add(code(alias.asname.name if alias.asname
                                     else alias.name))
    needles = tuple(table.TEXT_NEEDLES)

    def wanted(name: str) -> bool:
        return name in _RULE_WORDS or name in aliases or any(
            needle in name for needle in needles)
    return wanted

# The positions of the module's nodes, resolved (once) on the first note:
# most modules get none, and resolving them is a pass over the whole tree.
Positions = Callable[[], Mapping[cst.CSTNode, CodeRange]]


class Context:
    """One module's rewriting state, shared by the rules.

    Args:
      module: the module as parsed (the rules see its nodes as `original`).
      positions: where each of its nodes is.
      run: what the other modules of the run say about compile.
    """

    def __init__(self, module: cst.Module, positions: Positions,
                 run: Run = ALONE) -> None:
        self._positions = positions
        self.notes: List[Note] = []
        # ids of the nodes a rule may act on (or on what they hold): the
        # transformer enters no other.
        self._syntax, self.relevant = collect(module, _wanted(module))
        self.facts = Facts(self._syntax, self.name_of, run)
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
