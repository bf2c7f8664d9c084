"""Small helpers over libcst nodes: literals, code text, new nodes."""

from __future__ import annotations

import operator
from typing import Any, Dict, List, NamedTuple, Sequence, Tuple, Union

import libcst as cst

__all__ = [
    "Note",
    "Unconvertible",
    "bind",
    "code",
    "dotted",
    "kwarg",
    "literal",
    "separated",
    "short",
    "split",
]


class Note(NamedTuple):
    """A line the rewriter could not convert, and why."""

    line: int
    reason: str


class Unconvertible(Exception):
    """Raised for an expression the rewriter cannot convert statically."""


_BINARY = {cst.Add: operator.add, cst.Subtract: operator.sub,
           cst.Multiply: operator.mul, cst.Divide: operator.truediv,
           cst.Power: operator.pow}
_CONSTANTS = {"None": None, "True": True, "False": False}


def literal(node: cst.BaseExpression) -> Any:
    """The value of a literal: a number (maybe arithmetic), str or None.

    Raises:
      Unconvertible: `node` is anything else (a name, a call, ...).
    """
    if isinstance(node, (cst.Integer, cst.Float, cst.SimpleString,
                         cst.ConcatenatedString)):
        return node.evaluated_value
    if isinstance(node, cst.Name) and node.value in _CONSTANTS:
        return _CONSTANTS[node.value]
    if isinstance(node, cst.UnaryOperation) and isinstance(
            node.operator, (cst.Minus, cst.Plus)):
        value = literal(node.expression)
        return -value if isinstance(node.operator, cst.Minus) else value
    if isinstance(node, cst.BinaryOperation) and type(
            node.operator) in _BINARY:
        return _BINARY[type(node.operator)](literal(node.left),
                                            literal(node.right))
    raise Unconvertible(f"{code(node)} is not a literal")


def code(node: cst.CSTNode) -> str:
    """The source text of `node`."""
    return cst.Module(body=[]).code_for_node(node)


def kwarg(name: str, value: cst.BaseExpression) -> cst.Arg:
    """`name=value`, spelt without spaces around `=`."""
    return cst.Arg(value=value, keyword=cst.Name(name),
                   equal=cst.AssignEqual(
                       whitespace_before=cst.SimpleWhitespace(""),
                       whitespace_after=cst.SimpleWhitespace("")))


def dotted(name: str) -> Union[cst.Attribute, cst.Name]:
    """An expression node for a dotted name such as `tf_lossscale.X`."""
    parts = name.split(".")
    if not all(part.isidentifier() for part in parts):
        raise ValueError(f"{name!r} is not a dotted name")
    node: Union[cst.Attribute, cst.Name] = cst.Name(parts[0])
    for part in parts[1:]:  # Built, not parsed: a parse costs a millisecond.
        node = cst.Attribute(value=node, attr=cst.Name(part))
    return node


def split(name: str) -> Tuple[str, str]:
    """`a.b.c` -> (`a.b`, `c`)."""
    module, _, member = name.rpartition(".")
    return module, member


def short(name: str) -> str:
    """A qualified name as users write it: `tf.` for `tensorflow.`."""
    return name.replace("tensorflow.", "tf.", 1)


def bind(args: Sequence[cst.Arg], params: Sequence[str],
         what: str) -> Dict[str, int]:
    """Maps parameter names to argument indices, as a call would bind them.

    Raises:
      Unconvertible: a `*args`/`**kwargs` argument, or an argument that
        binds to no parameter in `params`.
    """
    bound = {}
    for i, arg in enumerate(args):
        if arg.star:
            raise Unconvertible(f"{what} is called with *args or **kwargs")
        name = arg.keyword.value if arg.keyword else (
            params[i] if i < len(params) else None)
        if name is None or name not in params:
            raise Unconvertible(f"{what} got an unexpected argument "
                                f"{code(arg).rstrip(', ')}")
        bound[name] = i
    return bound


def separated(args: List[cst.Arg], separator: Any,
              last: Any) -> List[cst.Arg]:
    """`args` with a call's own separator between them and its own last comma.

    One argument per line stays one per line when `separator` is the comma
    of such a call; `last` is the original trailing comma, or none.
    """
    if not isinstance(separator, cst.Comma):
        separator = cst.MaybeSentinel.DEFAULT
    return [arg.with_changes(comma=separator if i < len(args) - 1 else last)
            for i, arg in enumerate(args)]
