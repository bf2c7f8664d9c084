"""The rewriter: legacy loss-scaling source in, current source out.

`rewrite(source)` is pure text to text. One libcst pass applies the rules,
each in a module of its own:

- `names`: legacy names become their current spelling;
- `calls`: calls whose arguments or meaning changed (loss scales, policies,
  the graph rewrite, compile's implicit wrapper);
- `loss_scale_reads`: `x.loss_scale` that meant a `LossScale` object;
- `imports`: import statements follow their names.

They share a `context.Context` (qualified names, notes, the module's
`facts`). What a rule cannot convert is kept and reported as a `Note`.
libcst keeps comments and formatting. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import ast
import gc
import re
from typing import (
    Any,
    Dict,
    List,
    Mapping,
    NamedTuple,
    Optional,
    Sequence,
    Set,
    Tuple,
    TypeVar,
    Union,
)

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor, ImportItem
from libcst.metadata import CodeRange, PositionProvider

from tf_lossscale.compat import legacy_names as table
from tf_lossscale.compat.rewrite import calls, imports, loss_scale_reads, names
from tf_lossscale.compat.rewrite.compile_scaling import (
    ALONE,
    CompileScaling,
    Run,
    join,
)
from tf_lossscale.compat.rewrite.context import Context, Positions
from tf_lossscale.compat.rewrite.syntax import Note

__all__ = ["ModuleFacts", "Note", "Run", "module_facts", "rewrite",
           "run_facts"]

_Node = TypeVar("_Node", bound=cst.CSTNode)


class _Transformer(cst.CSTTransformer):
    """Dispatches each node to the rules that apply to its kind."""

    def __init__(self, positions: Positions, run: Run) -> None:
        super().__init__()
        self._run = run
        self.ctx: Optional[Context] = None
        self._positions = positions
        # Whether a rule replaced a node: if none did, the code is the
        # source's (not generated again).
        self.changed = False

    def _context(self) -> Context:
        assert self.ctx is not None, "visit_Module sets it first"
        return self.ctx

    # Only the nodes that hold something a rule acts on are entered (most
    # of a module is not: `Context.relevant`), and none of libcst's
    # per-field hooks is looked up.

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self.ctx is not None and id(node) not in self.ctx.relevant:
            return False
        return super().on_visit(node)

    def on_leave(self, original_node: _Node, updated_node: _Node
                 ) -> Union[_Node, cst.RemovalSentinel,
                            cst.FlattenSentinel[_Node]]:
        if id(original_node) not in self._context().relevant:
            return updated_node
        result = super().on_leave(original_node, updated_node)
        if result is not updated_node:
            self.changed = True
        return result

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        pass

    def on_leave_attribute(self, original_node: cst.CSTNode,
                           attribute: str) -> None:
        pass

    def visit_Module(self, node: cst.Module) -> None:
        self.ctx = Context(node, self._positions, self._run)

    # Imports are rewritten whole, by statement line.

    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def visit_SimpleStatementLine(self,
                                  node: cst.SimpleStatementLine) -> None:
        self._context().enter_statement()

    def leave_SimpleStatementLine(
            self, original: cst.SimpleStatementLine,
            updated: cst.SimpleStatementLine
    ) -> Union[cst.BaseStatement, cst.FlattenSentinel[cst.BaseStatement],
               cst.RemovalSentinel]:
        ctx = self._context()
        before = ctx.leave_statement()
        lines: Sequence[cst.BaseStatement] = imports.rewrite_line(
            ctx, original, updated)
        if not before and len(lines) == 1 and lines[0] is updated:
            return updated
        if not before and not lines:
            return cst.RemoveFromParent()
        if before and lines:  # The added lines go where the line began.
            first = lines[0]
            assert isinstance(first, cst.SimpleStatementLine)
            before[0] = before[0].with_changes(
                leading_lines=first.leading_lines)
            lines = [first.with_changes(leading_lines=()), *lines[1:]]
        return cst.FlattenSentinel([*before, *lines])

    # Names.

    def visit_Attribute(self, node: cst.Attribute) -> None:
        names.mark_prefixes(self._context(), node)

    def leave_Attribute(self, original: cst.Attribute,
                        updated: cst.Attribute) -> cst.BaseExpression:
        ctx = self._context()
        if not ctx.handled(original):
            loss_scale_reads.check_read(ctx, original)
        return names.rename_attribute(ctx, original, updated)

    def leave_Name(self, original: cst.Name,
                   updated: cst.Name) -> cst.BaseExpression:
        return names.rename_name(self._context(), original, updated)

    # Calls.

    def visit_Call(self, node: cst.Call) -> None:
        ctx = self._context()
        ctx.called.add(id(node.func))
        if isinstance(node.func, cst.Name) and node.func.value in (
                "isinstance", "issubclass") and len(node.args) == 2:
            classes = node.args[1].value
            ctx.tested.update(
                [id(e.value) for e in classes.elements] if isinstance(
                    classes, cst.Tuple) else [id(classes)])
        calls.mark_handled(ctx, node)
        if loss_scale_reads.is_loss_scale_call(node):
            ctx.handle(node.func)

    def leave_Call(self, original: cst.Call,
                   updated: cst.Call) -> cst.BaseExpression:
        ctx = self._context()
        if loss_scale_reads.is_loss_scale_call(original):
            return loss_scale_reads.rewrite_call(ctx, original, updated)
        return calls.rewrite_call(ctx, original, updated)


# A use of `tf_lossscale.X` on a line that is no import statement.
_USES_TF_LOSSSCALE = re.compile(
    r"^(?![ \t]*(?:import|from)[ \t]).*\btf_lossscale\.", re.MULTILINE)


def _imports(statement: cst.BaseStatement) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and any(
        isinstance(s, (cst.Import, cst.ImportFrom)) for s in statement.body)


def _add_imports(module: cst.Module, text: str,
                 modules: Sequence[str]) -> str:
    """`text` (`module`'s code) with `import m` for each of `modules` it
    lacks, placed by libcst's AddImportsVisitor, which is run on the
    module's top only (up to the statement after its last top-level import:
    all it reads and changes), not on every line of a large module; only
    that top is generated again."""
    if not modules:
        return text
    body = list(module.body)
    last = max((i for i, s in enumerate(body) if _imports(s)), default=-1)
    cut = min(len(body), last + 2)
    top = module.with_changes(body=body[:cut], footer=(),
                              has_trailing_newline=True)
    new_top = top.visit(AddImportsVisitor(
        CodemodContext(), [ImportItem(m) for m in modules]))
    before = top.code
    if not text.startswith(before):  # The file's last line is in the top.
        return module.with_changes(header=new_top.header, body=[
            *new_top.body, *body[cut:]]).code
    return new_top.code + text[len(before):]


# A module longer than twice this is parsed in pieces of about this many
# lines: libcst's parser needs some 25 kB of memory per line while it
# parses, the tree it gives a few.
CHUNK_LINES = 2000
_NEWLINE = re.compile(r"\r\n|\r|\n")


def _parse(source: str) -> cst.Module:
    """`cst.parse_module(source)`, a large module in pieces at top-level
    statements (found by Python's own parser), joined into one tree.

    Each piece's code is its text (libcst's promise); the joined module's
    is theirs one after the other, as the blank lines and comments between
    two pieces (the first's footer, the next's header) become the leading
    lines of the next's first statement. Pieces that differ in newline or
    indentation are not joined: the module is parsed whole.
    """
    line_ends = [m.end() for m in _NEWLINE.finditer(source)]
    if len(line_ends) < 2 * CHUNK_LINES:
        return cst.parse_module(source)
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return cst.parse_module(source)  # Raises the error, with its line.
    starts = [min([s.lineno, *(d.lineno for d in getattr(
        s, "decorator_list", ()))]) for s in tree.body]
    del tree
    bounds = [1]
    for start in starts:
        if start - bounds[-1] >= CHUNK_LINES:
            bounds.append(start)
    offsets = [0, *line_ends]
    texts = [source[offsets[a - 1]:offsets[b - 1]] for a, b in
             zip(bounds, bounds[1:])] + [source[offsets[bounds[-1] - 1]:]]
    pieces = [cst.parse_module(text) for text in texts]
    first = pieces[0]
    body = list(first.body)
    for before, piece in zip(pieces, pieces[1:]):
        if (piece.default_indent, piece.default_newline) != (
                first.default_indent, first.default_newline) or (
                not piece.body):
            return cst.parse_module(source)
        head = piece.body[0]
        body.append(head.with_changes(leading_lines=[
            *before.footer, *piece.header, *head.leading_lines]))
        body += piece.body[1:]
    module = first.with_changes(body=body, footer=pieces[-1].footer,
                                has_trailing_newline=(
                                    pieces[-1].has_trailing_newline))
    return module


def rewrite(source: str, run: Run = ALONE) -> Tuple[str, List[Note]]:
    """Rewrites one module's legacy loss-scaling code; pure text to text.

    Args:
      source: Python source.
      run: what the other modules migrated with it say about `compile`
        (`run_facts`): a policy set in one module governs the `compile`
        of another.

    Returns:
      The rewritten source (equal to `source` if there was nothing to do)
      and the notes on what was left as it was, sorted by line.

    Raises:
      libcst.ParserSyntaxError: `source` is not valid Python.
    """
    # The cyclic garbage collector is paused: the tree and the rewrite make
    # no garbage cycles of note, and its passes over the whole growing heap
    # made a large module's rewrite a third slower and super-linear.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _rewrite(source, run)
    finally:
        if enabled:
            gc.enable()


def _rewrite(source: str, run: Run) -> Tuple[str, List[Note]]:
    if "\r" in source and "\n" not in source:
        # Old Mac newlines: libcst drops the file's last one; parse it with
        # "\n" (no other "\n" is in the text) and give the "\r"s back.
        new, notes = _rewrite(source.replace("\r", "\n"), run)
        return new.replace("\n", "\r"), notes
    parsed = _parse(source)
    # The module is not changed in place (the transformer makes new
    # nodes), so the wrapper need not copy it: its positions are those of
    # the nodes the rules see.
    wrapper = cst.MetadataWrapper(parsed, unsafe_skip_copy=True)
    positions: Dict[str, Mapping[cst.CSTNode, CodeRange]] = {}

    def resolve() -> Mapping[cst.CSTNode, CodeRange]:
        if "found" not in positions:
            positions["found"] = wrapper.resolve(PositionProvider)
        return positions["found"]

    transformer = _Transformer(resolve, run)
    module = parsed.visit(transformer)
    ctx = transformer._context()
    if not transformer.changed:
        return source, sorted(ctx.notes)
    text = module.code
    if text == source:
        return source, sorted(ctx.notes)
    needed: Any = sorted(ctx.facts.imports_needed)
    if _USES_TF_LOSSSCALE.search(text):
        needed.append("tf_lossscale")
    return _add_imports(module, text, needed), sorted(ctx.notes)


# Texts that a module setting the global policy holds.
_SETTER_TEXTS = tuple(sorted({name.rsplit(".", 1)[1]
                              for name in table.POLICY_SETTERS}))


class ModuleFacts(NamedTuple):
    """What one module says about `compile`, for `run_facts`."""

    scaling: Optional[CompileScaling]  # None: the module sets no policy.
    legacy: bool  # It sets a TF 2.1-2.3 policy.
    compiles: bool  # It calls a `.compile(...)` method.


def module_facts(source: str) -> ModuleFacts:
    """The policies `source` sets and whether it compiles; cheap for a
    module that sets none (Python's own parser, no libcst).

    Raises:
      SyntaxError, ValueError, libcst.ParserSyntaxError: it does not parse.
    """
    compiles = "compile" in source and _compiles(ast.parse(source))
    if not any(text in source for text in _SETTER_TEXTS):
        return ModuleFacts(None, False, compiles)
    ctx = Context(_parse(source), lambda: {})
    scaling = ctx.facts.compile_scaling()
    if not ctx.facts._sets_policy:
        return ModuleFacts(None, False, compiles)
    return ModuleFacts(scaling, ctx.facts.sets_legacy_policy(), compiles)


def _compiles(tree: ast.AST) -> bool:
    """True if `tree` calls `x.compile(...)` with `x` not an imported
    module (`re.compile` is not Keras')."""
    imported: Set[str] = set()
    calls: List[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imported.update((a.asname or a.name).split(".")[0]
                            for a in node.names)
        elif isinstance(node, ast.Call) and isinstance(
                node.func, ast.Attribute) and node.func.attr == "compile":
            calls.append(node.func.value)
    for receiver in calls:
        while isinstance(receiver, ast.Attribute):
            receiver = receiver.value
        if not (isinstance(receiver, ast.Name) and receiver.id in imported):
            return True
    return False


def run_facts(modules: Sequence[ModuleFacts]) -> Run:
    """What the modules of one run say about `compile`, for `rewrite`.

    Only a run with a policy that has a loss scale of its own (`Policy(
    'mixed_float16', loss_scale=128)`) governs the compile of other
    modules: their optimizers are wrapped with that scale where mixed_float16
    is in force, or, if the run's policies disagree, reported.
    """
    setting = [m for m in modules if m.scaling is not None]
    if not any(isinstance(m.scaling, tuple) and m.scaling
               for m in setting):
        # No policy of the run has a loss scale of its own (a fixed one,
        # say): Keras' compile still wraps the optimizers of the other
        # modules under mixed_float16 as TF 2.4-2.15's did, with dynamic
        # scaling; nothing is lost where they are left as they are. (A
        # repository holds many programs: its test modules set policies
        # for themselves.)
        return ALONE
    return Run(scaling=join(m.scaling for m in setting
                            if m.scaling is not None),
               legacy=any(m.legacy for m in setting),
               compiles=any(m.compiles for m in modules
                            if m.scaling is None))
