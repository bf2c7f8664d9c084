"""A read-only walk over a libcst tree, several times cheaper than a visit.

libcst's `node.visit(visitor)` rebuilds (and validates) every node it
passes, also for a `CSTVisitor`, and looks up `visit_<Node>_<attribute>`
hooks for each child field: on a large module that was most of the
rewriter's time (issue 33, item 4). `walk` reads the same children in the
same order (the order libcst's own visit enters them, learnt once per
node type) and calls the visitor's `visit_<Node>` and `leave_<Node>`
methods, without rebuilding anything. Whitespace,
punctuation and operator nodes, which hold no name, are not entered.

It also tells which nodes hold, at any depth, a `Name` whose value a
predicate accepts (`Walk.marked`): the rewriter's rules act only on such
nodes, so its transformer skips the rest.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Set, Tuple

import libcst as cst

__all__ = ["Walk"]

# Node types that hold no name (nor anything the rewriter reads).
_LEAVES: Tuple[type, ...] = (
    cst.BaseParenthesizableWhitespace, cst.TrailingWhitespace, cst.EmptyLine,
    cst.Comment, cst.Newline, cst.Comma, cst.Dot, cst.Semicolon, cst.Colon,
    cst.AssignEqual, cst.LeftParen, cst.RightParen, cst.LeftSquareBracket,
    cst.RightSquareBracket, cst.LeftCurlyBrace, cst.RightCurlyBrace,
    cst.BaseBinaryOp, cst.BaseBooleanOp, cst.BaseCompOp, cst.BaseUnaryOp,
    cst.BaseAugOp, cst.ImportStar, cst.Asynchronous, cst.ParamStar,
    cst.ParamSlash, cst.SimpleString, cst.Integer, cst.Float, cst.Imaginary,
    cst.Ellipsis,
)


class _FieldOrder(cst.CSTVisitor):
    """Records the fields libcst's own visit enters, in order, for the one
    node it is handed: that node is entered, its children are not."""

    def __init__(self) -> None:
        super().__init__()
        self.fields: list = []
        self._entered = False

    def on_visit(self, node: cst.CSTNode) -> bool:
        entered, self._entered = self._entered, True
        return not entered

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        self.fields.append(attribute)

    def on_leave_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        pass


_FIELDS: Dict[type, Tuple[str, ...]] = {}


def _fields(node: cst.CSTNode) -> Tuple[str, ...]:
    """The child fields of `node`'s type, in visit order (learnt once)."""
    kind = type(node)
    fields = _FIELDS.get(kind)
    if fields is None:
        recorder = _FieldOrder()
        node.visit(recorder)
        fields = _FIELDS[kind] = tuple(dict.fromkeys(recorder.fields))
    return fields


class Walk:
    """Walks a tree once, calling `visitor`'s `visit_X`/`leave_X` methods.

    Args:
      visitor: any object; `visit_X(node)` returning False skips the
        children of an X (its `leave_X` still runs), as with libcst.
      wanted: tells the `Name` values to look for (asked once per value).
      always: node types counted as holding one of `names` (their
        children may be skipped).

    `marked` holds the ids of the nodes that hold a `Name` `wanted`
    accepts (or are of a type in `always`), themselves included.
    """

    def __init__(self, visitor: Any, wanted: Callable[[str], bool],
                 always: Tuple[type, ...] = ()) -> None:
        self._visitor = visitor
        self._wanted = wanted
        self._names: Dict[str, bool] = {}
        self._always = always
        self.marked: Set[int] = set()
        self._hooks: Dict[type, Tuple[Optional[Callable[..., Any]],
                                      Optional[Callable[..., Any]],
                                      bool]] = {}

    def _hooks_of(self, kind: type) -> Tuple[Optional[Callable[..., Any]],
                                             Optional[Callable[..., Any]],
                                             bool]:
        hooks = self._hooks.get(kind)
        if hooks is None:
            name = kind.__name__
            hooks = self._hooks[kind] = (
                getattr(self._visitor, f"visit_{name}", None),
                getattr(self._visitor, f"leave_{name}", None),
                issubclass(kind, self._always))
        return hooks

    def walk(self, node: cst.CSTNode) -> bool:
        """Walks `node`; True if it holds one of the names."""
        visit, leave, always = self._hooks_of(type(node))
        found = always
        if visit is None or visit(node) is not False:
            if type(node) is cst.Name:
                value = node.value
                wanted = self._names.get(value)
                if wanted is None:
                    wanted = self._names[value] = self._wanted(value)
                found = found or wanted
            for field in _fields(node):
                value = getattr(node, field)
                kind = _kind(type(value))
                if kind is _NODE:
                    if self.walk(value):
                        found = True
                elif kind is _SEQUENCE:
                    for child in value:
                        if _kind(type(child)) is _NODE and self.walk(child):
                            found = True
        if leave is not None:
            leave(node)
        if found:
            self.marked.add(id(node))
        return found


# What a field's value is, by type (isinstance against libcst's abstract
# classes is slow): a node to walk, a sequence of children, or neither (a
# string, a sentinel, a node that holds no name).
_NODE, _SEQUENCE, _OTHER = "node", "sequence", "other"
_KINDS: Dict[type, str] = {tuple: _SEQUENCE, list: _SEQUENCE}


def _kind(kind: type) -> str:
    found = _KINDS.get(kind)
    if found is None:
        found = _KINDS[kind] = (
            _NODE if issubclass(kind, cst.CSTNode)
            and not issubclass(kind, _LEAVES) else _OTHER)
    return found
