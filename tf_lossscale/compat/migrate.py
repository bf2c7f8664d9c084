"""The `migrate` command: rewrites legacy loss-scaling code to the current API.

`python -m tf_lossscale migrate PATH...` turns TF 2.1-2.4 code into code that
runs on today's TensorFlow without the `tf_lossscale.compat` shim::

    from tensorflow.keras.mixed_precision import experimental as mp
    mp.set_policy("mixed_float16")
    opt = mp.LossScaleOptimizer(opt, loss_scale=123)
    ls = tf.train.experimental.DynamicLossScale(2048)

becomes::

    from tensorflow.keras import mixed_precision as mp
    import tf_lossscale
    mp.set_global_policy("mixed_float16")
    opt = tf_lossscale.LossScaleOptimizer(opt, dynamic=False, initial_scale=123)
    ls = tf_lossscale.DynamicLossScale(2048)

Which name becomes which is `legacy_names.LEGACY_NAMES`, the table the
shim reads too; the experimental optimizer's `loss_scale=` is converted by
the same rules as its config (`from_legacy_loss_scale`). libcst keeps
comments and formatting. What cannot be converted statically (a
`loss_scale` held in a variable, a `Policy` with a non-default loss scale)
is left as it was and reported as `file:line: reason`.
"""

from __future__ import annotations

import difflib
import operator
import sys
import tokenize
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor, ImportItem
from libcst.helpers import get_full_name_for_node
from libcst.metadata import (PositionProvider, QualifiedNameProvider,
                             QualifiedNameSource)

from tf_lossscale import config_conversion
from tf_lossscale.compat import legacy_names as table

__all__ = ["Note", "rewrite", "run"]

_KERAS_OPTIMIZER = ("tensorflow.keras.mixed_precision.experimental."
                    "LossScaleOptimizer")
_KERAS_POLICY = "tensorflow.keras.mixed_precision.experimental.Policy"
# Arguments of the loss-scale constructors, in order, and the optimizer
# argument each one becomes.
_FIXED_PARAMS = ("loss_scale_value",)
_DYNAMIC_PARAMS = ("initial_loss_scale", "increment_period", "multiplier")
_OPTIMIZER_ARG_OF = {"loss_scale_value": "initial_scale",
                     **config_conversion.DYNAMIC_LOSS_SCALE_RENAMES}
_BY_HAND = ("pass dynamic=, initial_scale= and dynamic_growth_steps= to "
            "tf_lossscale.LossScaleOptimizer by hand")


class Note(NamedTuple):
    """Something the rewriter left as it was, and why."""
    line: int
    reason: str


class _Unconvertible(Exception):
    """Raised for an expression the rewriter cannot convert statically."""


# Literals: the only values the rewriter can check against the table.

_BINARY = {cst.Add: operator.add, cst.Subtract: operator.sub,
           cst.Multiply: operator.mul, cst.Divide: operator.truediv,
           cst.Power: operator.pow}


def _literal(node: cst.BaseExpression) -> Any:
    """The value of a literal: a number (maybe arithmetic), str or None."""
    if isinstance(node, (cst.Integer, cst.Float, cst.SimpleString,
                         cst.ConcatenatedString)):
        return node.evaluated_value
    if isinstance(node, cst.Name) and node.value in ("None", "True",
                                                     "False"):
        return {"None": None, "True": True, "False": False}[node.value]
    if isinstance(node, cst.UnaryOperation) and isinstance(
            node.operator, (cst.Minus, cst.Plus)):
        value = _literal(node.expression)
        return -value if isinstance(node.operator, cst.Minus) else value
    if isinstance(node, cst.BinaryOperation) and type(
            node.operator) in _BINARY:
        return _BINARY[type(node.operator)](_literal(node.left),
                                            _literal(node.right))
    raise _Unconvertible(f"{_code(node)} is not a literal")


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def _kwarg(name: str, value: cst.BaseExpression) -> cst.Arg:
    return cst.Arg(value=value, keyword=cst.Name(name),
                   equal=cst.AssignEqual(
                       whitespace_before=cst.SimpleWhitespace(""),
                       whitespace_after=cst.SimpleWhitespace("")))


def _bind(args: Sequence[cst.Arg], params: Sequence[str],
          what: str) -> Dict[str, int]:
    """Maps parameter names to argument indices, as a call would bind them."""
    bound = {}
    for i, arg in enumerate(args):
        if arg.star:
            raise _Unconvertible(f"{what} is called with *args or **kwargs")
        name = arg.keyword.value if arg.keyword else (
            params[i] if i < len(params) else None)
        if name not in params:
            raise _Unconvertible(f"{what} got an unexpected argument "
                                 f"{_code(arg).rstrip(', ')}")
        bound[name] = i
    return bound


def _fixed_args(loss_scale_value: Any) -> Dict[str, Any]:
    """The table's conversion of `FixedLossScale(loss_scale_value)`."""
    return config_conversion.fixed_args(loss_scale_value)


def _separated(args: List[cst.Arg], separator: Any,
               last: Any) -> List[cst.Arg]:
    """`args` with the call's own separator between them (one per line if
    its arguments were) and its own trailing comma, or none, at the end."""
    if not isinstance(separator, cst.Comma):
        separator = cst.MaybeSentinel.DEFAULT
    return [arg.with_changes(comma=separator if i < len(args) - 1 else last)
            for i, arg in enumerate(args)]


def _dotted(name: str) -> cst.BaseExpression:
    return cst.parse_expression(name)


def _split(name: str) -> Tuple[str, str]:
    module, _, member = name.rpartition(".")
    return module, member


def _short(name: str) -> str:
    return name.replace("tensorflow.", "tf.", 1)


class _Rewriter(cst.CSTTransformer):
    """One pass over a module; `notes` collects what it left."""

    METADATA_DEPENDENCIES = (QualifiedNameProvider, PositionProvider)

    def __init__(self) -> None:
        super().__init__()
        self.notes: List[Note] = []
        self._inner: set = set()  # ids of prefixes of legacy names

    # Helpers.

    def _line(self, node: cst.CSTNode) -> int:
        return self.get_metadata(PositionProvider, node).start.line

    def _note(self, node: cst.CSTNode, reason: str) -> None:
        self.notes.append(Note(self._line(node), reason))

    def _name_of(self, node: cst.CSTNode) -> Optional[str]:
        """The imported name `node` refers to, e.g. tensorflow.train.x."""
        names = self.get_metadata(QualifiedNameProvider, node, set())
        for qualified in sorted(names, key=lambda q: q.name):
            if qualified.source is QualifiedNameSource.IMPORT:
                return qualified.name
        return None

    @staticmethod
    def _vanished(name: Optional[str]) -> Optional[str]:
        """The vanished legacy module `name` is in, or is, if any."""
        for module in table.VANISHED_MODULES:
            if name == module or (name or "").startswith(module + "."):
                return module
        return None

    # Names: tf.train.experimental.DynamicLossScale -> tf_lossscale....

    def visit_Import(self, node: cst.Import) -> bool:
        return False  # Imports are rewritten whole, by statement.

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def visit_Attribute(self, node: cst.Attribute) -> None:
        name = self._name_of(node)
        if name in table.LEGACY_NAMES or (
                self._vanished(name) and name not in table.VANISHED_MODULES):
            value = node.value
            while isinstance(value, cst.Attribute):
                self._inner.add(id(value))
                value = value.value
            self._inner.add(id(value))

    def leave_Attribute(self, original: cst.Attribute,
                        updated: cst.Attribute) -> cst.BaseExpression:
        if id(original) in self._inner:
            return updated
        name = self._name_of(original)
        if name in table.LEGACY_NAMES:
            return self._current_reference(original, updated, name)
        if self._vanished(name):
            self._note(original, f"{_short(name)} has no current "
                       "equivalent in the migration table; rewrite it by "
                       "hand")
        return updated

    def leave_Name(self, original: cst.Name,
                   updated: cst.Name) -> cst.BaseExpression:
        if id(original) in self._inner:
            return updated
        name = self._name_of(original)
        if name in table.LEGACY_NAMES:
            module, member = _split(table.LEGACY_NAMES[name].current)
            if original.value == _split(name)[1]:
                return updated.with_changes(value=member)
            return updated  # Imported under an alias, which is kept.
        vanished = self._vanished(name)
        if vanished and table.VANISHED_MODULES[vanished] is None:
            self._note(original, f"{original.value} refers to the legacy "
                       f"module {_short(vanished)}, which has no current "
                       "equivalent; rewrite it by hand")
        return updated

    def _current_reference(self, original: cst.Attribute,
                           updated: cst.Attribute,
                           name: str) -> cst.BaseExpression:
        """`prefix.member` for a legacy name, in its current spelling."""
        legacy_module = _split(name)[0]
        module, member = _split(table.LEGACY_NAMES[name].current)
        if module != table.VANISHED_MODULES.get(legacy_module):
            return _dotted(table.LEGACY_NAMES[name].current)
        prefix = updated.value
        if isinstance(prefix, cst.Attribute) and (
                prefix.attr.value == _split(legacy_module)[1]):
            prefix = prefix.value  # tf.keras.mixed_precision.experimental
        # A Name prefix is an alias whose import now binds `module`.
        return updated.with_changes(value=prefix, attr=cst.Name(member))

    # Calls whose arguments changed.

    def leave_Call(self, original: cst.Call,
                   updated: cst.Call) -> cst.BaseExpression:
        name = self._name_of(original.func)
        try:
            if name == _KERAS_OPTIMIZER:
                return self._optimizer_call(original, updated)
            if name == _KERAS_POLICY:
                return self._policy_call(original, updated)
        except _Unconvertible as e:
            return self._left(original, updated, name, str(e))
        return updated

    def _left(self, original: cst.Call, updated: cst.Call, name: str,
              why: str) -> cst.Call:
        """Keeps a call the rewriter cannot convert, and notes why.

        The experimental optimizer becomes tf_lossscale's own deprecated
        one, which takes `loss_scale=` and runs today; a `Policy` keeps its
        legacy spelling: its loss scale needs the shim's compile hook.
        """
        why = why.rstrip(".")
        if name == _KERAS_OPTIMIZER:
            func = _dotted(table.LEGACY_NAMES[name].shim)
            self._note(original, f"{_short(name)}: {why}; left as "
                       f"{table.LEGACY_NAMES[name].shim}")
        else:
            func = original.func
            self._note(original, f"{_short(name)}: {why}; left unchanged")
        return updated.with_changes(func=func)

    def _optimizer_call(self, original: cst.Call,
                        updated: cst.Call) -> cst.Call:
        bound = _bind(original.args, ("optimizer", "loss_scale"),
                      "LossScaleOptimizer")
        args = []
        if "optimizer" in bound:
            arg = updated.args[bound["optimizer"]]
            if arg.keyword:
                arg = arg.with_changes(keyword=cst.Name("inner_optimizer"))
            args.append(arg)
        if "loss_scale" in bound:
            i = bound["loss_scale"]
            args += self._loss_scale_args(original.args[i].value,
                                          updated.args[i].value)
        return updated.with_changes(args=_separated(
            args, updated.args[0].comma, updated.args[-1].comma))

    def _loss_scale_args(self, original: cst.BaseExpression,
                         updated: cst.BaseExpression) -> List[cst.Arg]:
        """The optimizer arguments equal to the legacy `loss_scale`."""
        if isinstance(original, cst.Call):
            current = table.LEGACY_NAMES.get(self._name_of(original.func))
            constructor = current.current if current else self._name_of(
                original.func)
            if constructor == "tf_lossscale.FixedLossScale":
                return self._constructor_args(
                    original, updated, _FIXED_PARAMS, _fixed_args,
                    dynamic=False)
            if constructor == "tf_lossscale.DynamicLossScale":
                return self._constructor_args(
                    original, updated, _DYNAMIC_PARAMS,
                    config_conversion.from_dynamic_loss_scale_args, dynamic=True)
        try:
            value = _literal(original)
        except _Unconvertible as e:
            raise _Unconvertible(f"loss_scale={_code(original)}: {e}, so "
                                 f"the rewriter cannot tell its kind; "
                                 f"{_BY_HAND}") from None
        try:
            converted = config_conversion.from_legacy_loss_scale(value)
        except ValueError as e:
            raise _Unconvertible(str(e)) from None
        if converted["dynamic"]:
            return []  # "dynamic": the current defaults.
        return [_kwarg("dynamic", cst.Name("False")),
                _kwarg("initial_scale", updated)]

    def _constructor_args(self, original: cst.Call, updated: cst.Call,
                          params: Sequence[str], convert: Any,
                          dynamic: bool) -> List[cst.Arg]:
        """Optimizer arguments for a `FixedLossScale`/`DynamicLossScale` call.

        The table's `convert` checks the arguments when all are literals;
        others are passed on under their new names and checked at run time.
        """
        what = _code(original.func)
        bound = _bind(original.args, params, what)
        literals = {}
        for param, i in bound.items():
            try:
                literals[param] = _literal(original.args[i].value)
            except _Unconvertible:
                if param == "multiplier":
                    raise _Unconvertible(
                        f"{what}: multiplier={_code(original.args[i].value)}"
                        " is not a literal 2, the only multiplier the "
                        f"optimizer has; {_BY_HAND}") from None
        if len(literals) == len(bound):
            try:
                convert(**literals)
            except (TypeError, ValueError) as e:
                raise _Unconvertible(str(e)) from None
        args = [] if dynamic else [_kwarg("dynamic", cst.Name("False"))]
        for param, i in bound.items():
            if param in _OPTIMIZER_ARG_OF:
                args.append(_kwarg(_OPTIMIZER_ARG_OF[param],
                                   updated.args[i].value))
        return args

    def _policy_call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        bound = _bind(original.args, ("name", "loss_scale"), "Policy")
        if "loss_scale" not in bound:
            return updated
        why = ("the current Policy takes no loss scale: drop loss_scale and "
               "pass tf_lossscale.LossScaleOptimizer(optimizer, ...) to "
               "compile")
        try:
            policy = _literal(original.args[bound["name"]].value)
            loss_scale = _literal(original.args[bound["loss_scale"]].value)
        except (KeyError, _Unconvertible):
            raise _Unconvertible(why) from None
        if loss_scale not in ("auto",
                              table.default_policy_loss_scale(policy)):
            raise _Unconvertible(why)
        args = [a for i, a in enumerate(updated.args)
                if i != bound["loss_scale"]]
        args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated.with_changes(args=args)

    # Imports.

    def leave_SimpleStatementLine(
            self, original: cst.SimpleStatementLine,
            updated: cst.SimpleStatementLine) -> Any:
        body: List[cst.BaseSmallStatement] = []
        for statement in updated.body:
            if isinstance(statement, cst.Import):
                body += self._import(original, statement)
            elif isinstance(statement, cst.ImportFrom):
                body += self._import_from(original, statement)
            else:
                body.append(statement)
        if len(body) == len(updated.body) and all(
                a is b for a, b in zip(body, updated.body)):
            return updated
        if not body:
            return cst.RemoveFromParent()
        if len(updated.body) == 1:  # One import per line, as it was.
            return cst.FlattenSentinel(
                [updated.with_changes(body=[body[0]])]
                + [cst.SimpleStatementLine(body=[s]) for s in body[1:]])
        return updated.with_changes(body=[
            s.with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
            for s in body])

    def _import(self, line: cst.SimpleStatementLine,
                statement: cst.Import) -> List[cst.BaseSmallStatement]:
        """`import tensorflow.keras.mixed_precision.experimental as mp`."""
        names = []
        for alias in statement.names:
            module = get_full_name_for_node(alias.name)
            if module not in table.VANISHED_MODULES:
                names.append(alias)
                continue
            current = table.VANISHED_MODULES[module]
            if current is None and alias.asname is not None:
                continue  # Its members are spelt tf_lossscale.X now.
            names.append(alias.with_changes(
                name=_dotted(current or module.split(".")[0])))
        if len(names) == len(statement.names) and all(
                a is b for a, b in zip(names, statement.names)):
            return [statement]
        if not names:
            return []
        names[-1] = names[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return [statement.with_changes(names=names)]

    def _import_from(self, line: cst.SimpleStatementLine,
                     statement: cst.ImportFrom
                     ) -> List[cst.BaseSmallStatement]:
        """`from M import a, b as c`: legacy members move to their modules."""
        if statement.relative or statement.module is None:
            return [statement]
        module = get_full_name_for_node(statement.module)
        if isinstance(statement.names, cst.ImportStar):
            if module in table.VANISHED_MODULES:
                self._note(line, f"from {_short(module)} import *: name "
                           "the members instead, then migrate again")
            return [statement]
        kept, moved = [], {}
        for alias in statement.names:
            name = f"{module}.{get_full_name_for_node(alias.name)}"
            asname = alias.asname.name.value if alias.asname else None
            if name in table.VANISHED_MODULES:
                current = table.VANISHED_MODULES[name]
                if current is not None:
                    new_module, member = _split(current)
                    moved.setdefault(new_module, []).append(
                        (member, asname or _split(name)[1]))
            elif name in table.LEGACY_NAMES:
                new_module, member = _split(table.LEGACY_NAMES[name].current)
                moved.setdefault(new_module, []).append((member, asname))
            else:
                if module in table.VANISHED_MODULES:
                    self._note(line, f"{_short(name)} has no current "
                               "equivalent in the migration table; "
                               "rewrite it by hand")
                kept.append(alias)
        if not moved and len(kept) == len(statement.names):
            return [statement]
        statements: List[cst.BaseSmallStatement] = []
        if kept:
            kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            statements.append(statement.with_changes(names=kept))
        for new_module, members in moved.items():
            statements.append(cst.ImportFrom(
                module=_dotted(new_module),
                names=[cst.ImportAlias(
                    name=cst.Name(member),
                    asname=cst.AsName(name=cst.Name(asname))
                    if asname not in (None, member) else None)
                    for member, asname in members]))
        return statements


class _TfLossscaleUses(cst.CSTVisitor):
    """Finds `tf_lossscale.X` references outside import statements."""

    def __init__(self) -> None:
        super().__init__()
        self.found = False

    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if isinstance(node.value, cst.Name) and (
                node.value.value == "tf_lossscale"):
            self.found = True


def rewrite(source: str) -> Tuple[str, List[Note]]:
    """Rewrites one module's legacy loss-scaling code; pure text to text.

    Args:
      source: Python source.

    Returns:
      The rewritten source (equal to `source` if there was nothing to do)
      and the notes on what was left as it was, sorted by line.

    Raises:
      libcst.ParserSyntaxError: `source` is not valid Python.
    """
    wrapper = cst.MetadataWrapper(cst.parse_module(source))
    rewriter = _Rewriter()
    module = wrapper.visit(rewriter)
    uses = _TfLossscaleUses()
    module.visit(uses)
    if module.code != source and uses.found:
        module = module.visit(AddImportsVisitor(
            CodemodContext(), [ImportItem("tf_lossscale")]))
    return module.code, sorted(rewriter.notes)


def _python_files(paths: Sequence[str]) -> List[Path]:
    """The .py files named by `paths`, folders searched recursively."""
    files = []
    for path in map(Path, paths):
        if path.is_dir():
            files += sorted(path.rglob("*.py"))
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"{path}: no such file or folder")
    return files


def _read(path: Path) -> Tuple[str, str]:
    """The text of a Python file, newlines kept, and its encoding."""
    with path.open("rb") as f:
        encoding, _ = tokenize.detect_encoding(f.readline)
    with path.open(encoding=encoding, newline="") as f:
        return f.read(), encoding


def _migrate_file(path: Path, write: bool) -> List[str]:
    """Rewrites or diffs one file; returns its `file:line: reason` notes."""
    source, encoding = _read(path)
    try:
        new, notes = rewrite(source)
    except cst.ParserSyntaxError as e:
        return [f"{path}:{e.raw_line}: cannot parse: {e.message}"]
    if new != source:
        if write:
            with path.open("w", encoding=encoding, newline="") as f:
                f.write(new)
        else:
            old_name, new_name = (str(path),) * 2 if path.is_absolute() else (
                f"a/{path.as_posix()}", f"b/{path.as_posix()}")
            sys.stdout.writelines(difflib.unified_diff(
                source.splitlines(keepends=True),
                new.splitlines(keepends=True), old_name, new_name))
    return [f"{path}:{note.line}: {note.reason}" for note in notes]


def run(paths: Sequence[str], write: bool) -> int:
    """The `migrate` command.

    Args:
      paths: Python files, or folders to search for them.
      write: rewrite the files in place instead of printing a unified diff.

    Returns:
      0 if everything was converted, 1 if something was left (each reported
      on stderr as `file:line: reason`), 2 if a path does not exist.
    """
    try:
        files = _python_files(paths)
    except FileNotFoundError as e:
        print(f"migrate: {e}", file=sys.stderr)
        return 2
    left = []
    for path in files:
        left += _migrate_file(path, write)
    for line in left:
        print(line, file=sys.stderr)
    return 1 if left else 0
