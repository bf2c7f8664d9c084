"""What the rewriter knows about a module before it changes anything.

A legacy script often says what an object is on one line and uses it on
another: `opt = tf.keras.optimizers.SGD()` ... `model.compile(optimizer=opt)`,
or `mixed_precision.set_policy('mixed_float16')` far above the `compile` it
governs. `Facts` answers the questions the call rules ask, from one plain
pass over the module:

- `kind(expr)`: is it a Keras optimizer, a `tf.compat.v1` optimizer, a
  loss-scale optimizer (TF 2.1-2.3's experimental one in particular), a dtype
  policy, a string, or unknown? A name is what every assignment to it in the
  module makes (by name, across scopes: a static approximation).
- `compile_scaling()`: the loss scaling that `model.compile` added
  implicitly, from the global policies the module sets.
- `reference(...)`: how to spell `tf.config` or `tf.keras` in this module.
"""

from __future__ import annotations

import enum
from typing import (
    Callable,
    Dict,
    FrozenSet,
    List,
    NamedTuple,
    Optional,
    Set,
    Tuple,
)

import libcst as cst

from tf_lossscale.compat import legacy_names as table
from tf_lossscale.compat.rewrite.compile_scaling import (
    CompileScaling,
    CompileScalingFacts,
    Scaling,
)
from tf_lossscale.compat.rewrite.syntax import (
    Unconvertible,
    bind,
    code,
)

__all__ = ["Facts", "Kind", "Scaling", "collect"]

NameOf = Callable[[cst.CSTNode], Optional[str]]


class Kind(enum.Enum):
    """What an expression makes, as far as the rewriter can tell."""

    KERAS_OPTIMIZER = "a Keras optimizer"
    V1_OPTIMIZER = "a tf.compat.v1 optimizer"
    LOSS_SCALE_OPTIMIZER = "a loss-scale optimizer"
    EXPERIMENTAL_OPTIMIZER = "TF 2.1-2.3's experimental LossScaleOptimizer"
    POLICY = "a dtype policy"
    STRING = "a string"
    UNKNOWN = "unknown"


_LOSS_SCALE_KINDS = (Kind.LOSS_SCALE_OPTIMIZER, Kind.EXPERIMENTAL_OPTIMIZER)
_EXPERIMENTAL_OPTIMIZER = (
    "tensorflow.keras.mixed_precision.experimental.LossScaleOptimizer")
_SCALING_METHODS = ("get_scaled_loss", "get_unscaled_gradients", "minimize")
_LEGACY_SET_POLICY = "tensorflow.keras.mixed_precision.experimental.set_policy"


def _join(kinds: Set[Kind]) -> Kind:
    """The kind of a name that may hold any of `kinds`."""
    if len(kinds) == 1:
        return next(iter(kinds))
    if kinds and kinds <= set(_LOSS_SCALE_KINDS):
        return Kind.LOSS_SCALE_OPTIMIZER
    return Kind.UNKNOWN


class _Assignment(NamedTuple):
    """`target = value`, and where it happens."""

    value: cst.BaseExpression
    order: int  # Later than every node in `value`.
    blocks: Tuple[int, ...]  # ids of the blocks it is in, outermost first.


class _Syntax(cst.CSTVisitor):
    """One pass over the module: assignments, calls and module aliases.

    Each name, attribute and call gets an order (visit order) and its
    enclosing blocks, so that `Facts` can tell which assignments reach it.
    """

    def __init__(self) -> None:
        super().__init__()
        self.assigned: Dict[str, List[_Assignment]] = {}
        self.calls: List[cst.Call] = []
        # id(call) -> the targets of the assignment it is in, if any.
        self.call_targets: Dict[int, Tuple[str, ...]] = {}
        self._targets: List[Tuple[str, ...]] = []
        self.aliases: Dict[str, str] = {}  # local name -> module imported
        self.positions: Dict[int, Tuple[int, Tuple[int, ...]]] = {}
        self._blocks: List[int] = []
        self._order = 0
        self._depth = 0  # of function and class bodies

    def _mark(self, node: cst.CSTNode) -> None:
        self._order += 1
        self.positions[id(node)] = (self._order, tuple(self._blocks))

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self._blocks.append(id(node))

    def leave_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self._blocks.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._depth += 1

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._depth -= 1

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._depth += 1

    def leave_ClassDef(self, node: cst.ClassDef) -> None:
        self._depth -= 1

    def visit_Name(self, node: cst.Name) -> None:
        self._mark(node)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._mark(node)

    def visit_Call(self, node: cst.Call) -> None:
        self._mark(node)
        self.calls.append(node)
        if self._targets:
            self.call_targets[id(node)] = self._targets[-1]

    def visit_Assign(self, node: cst.Assign) -> None:
        self._targets.append(tuple(code(t.target) for t in node.targets))

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._targets.append((code(node.target),))

    def leave_Assign(self, node: cst.Assign) -> None:
        self._targets.pop()
        for target in node.targets:
            self._assign(target.target, node.value)

    def leave_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._targets.pop()
        if node.value is not None:
            self._assign(node.target, node.value)

    def _assign(self, target: cst.BaseExpression,
                value: cst.BaseExpression) -> None:
        if isinstance(target, (cst.Name, cst.Attribute)):
            self._order += 1
            self.assigned.setdefault(code(target), []).append(
                _Assignment(value, self._order, tuple(self._blocks)))

    def visit_Import(self, node: cst.Import) -> None:
        if self._depth:
            return
        for alias in node.names:
            module = code(alias.name)
            if alias.asname is not None:
                self.aliases[code(alias.asname.name)] = module
            elif "." not in module:
                self.aliases[module] = module

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if self._depth or node.relative or node.module is None or (
                isinstance(node.names, cst.ImportStar)):
            return
        for alias in node.names:
            local = code(alias.asname.name if alias.asname else alias.name)
            self.aliases[local] = f"{code(node.module)}.{code(alias.name)}"


def collect(module: cst.Module) -> _Syntax:
    """The syntax facts of `module` (no metadata needed)."""
    syntax = _Syntax()
    module.visit(syntax)
    return syntax


class Facts(CompileScalingFacts):
    """Answers about the module `syntax` was collected from.

    Args:
      syntax: what `collect` found.
      name_of: the qualified name an original node refers to, if imported.
    """

    def __init__(self, syntax: _Syntax, name_of: NameOf) -> None:
        self._syntax = syntax
        self._name_of = name_of
        self._scaling: Optional[CompileScaling] = None
        self.scaling_sources: Set[int] = set()  # ids of Policy calls set
        self.imports_needed: Set[str] = set()

    def _calls(self) -> List[cst.Call]:
        return self._syntax.calls

    # What an expression makes.

    def kind(self, node: cst.BaseExpression) -> Kind:
        """What `node` makes, following assignments to names."""
        return self._kind(node, frozenset())

    def _kind(self, node: cst.BaseExpression, seen: FrozenSet[int]) -> Kind:
        if isinstance(node, (cst.SimpleString, cst.ConcatenatedString,
                             cst.FormattedString)):
            return Kind.STRING
        if isinstance(node, cst.Call):
            return self._call_kind(node, seen)
        if isinstance(node, cst.IfExp) and self._keeps_loss_scale(node):
            return _join({Kind.LOSS_SCALE_OPTIMIZER,
                          self._kind(node.orelse, seen)})
        if isinstance(node, cst.Attribute) and node.attr.value in (
                "dtype_policy", "_dtype_policy"):
            return Kind.POLICY
        if isinstance(node, (cst.Name, cst.Attribute)) and (
                id(node) not in seen):
            values = self.reaching(node)
            kinds = {self._kind(v, seen | {id(node)}) for v in values}
            return _join(kinds)
        return Kind.UNKNOWN

    def _keeps_loss_scale(self, node: cst.IfExp) -> bool:
        """True for `x if isinstance(x, <LossScaleOptimizer>) else ...`."""
        test = node.test
        if not (isinstance(test, cst.Call) and code(test.func) == "isinstance"
                and len(test.args) == 2):
            return False
        return code(test.args[0].value) == code(node.body) and (
            self._name_of(test.args[1].value) in table.LOSS_SCALE_OPTIMIZERS)

    def _call_kind(self, node: cst.Call, seen: FrozenSet[int]) -> Kind:
        name = self._name_of(node.func) or ""
        if name in (_EXPERIMENTAL_OPTIMIZER,
                    "tf_lossscale.experimental.LossScaleOptimizer"):
            return Kind.EXPERIMENTAL_OPTIMIZER
        if table.GRAPH_REWRITE.get(name):
            opt = self.rewrite_optimizer(node)
            inner = Kind.UNKNOWN if opt is None else self._kind(opt, seen)
            return (Kind.EXPERIMENTAL_OPTIMIZER
                    if inner is Kind.KERAS_OPTIMIZER
                    else Kind.LOSS_SCALE_OPTIMIZER)
        if name in table.LOSS_SCALE_OPTIMIZERS:
            return Kind.LOSS_SCALE_OPTIMIZER
        if name in table.POLICY_CLASSES or name in table.POLICY_GETTERS:
            return Kind.POLICY
        if name.startswith(table.KERAS_OPTIMIZER_MODULES) and (
                ".schedules." not in name):
            return Kind.KERAS_OPTIMIZER
        if name.startswith(table.V1_OPTIMIZER_MODULES) and name.endswith(
                "Optimizer"):
            return Kind.V1_OPTIMIZER
        return Kind.UNKNOWN

    def reaching(self, node: cst.BaseExpression) -> List[cst.BaseExpression]:
        """The values assigned to `node`'s name that may reach `node`.

        The assignments before it, latest first, up to the first one in a
        block that encloses `node` (which always runs first); all of them if
        none comes before (say, a global read in a function defined above).
        A static approximation: by name, across scopes.
        """
        assignments = self._syntax.assigned.get(code(node), [])
        position = self._syntax.positions.get(id(node))
        if position is None:
            return [a.value for a in assignments]
        order, blocks = position
        before = [a for a in assignments if a.order < order]
        if not before:
            return [a.value for a in assignments]
        reaching = []
        for assignment in reversed(before):
            reaching.append(assignment.value)
            if blocks[:len(assignment.blocks)] == assignment.blocks:
                break
        return reaching

    def is_loss_scale_optimizer(self, node: cst.BaseExpression) -> bool:
        """True if `node` makes a loss-scale optimizer here, as far as the
        legacy code that asks for its loss scale could have run.

        A name may also hold a plain Keras optimizer (`opt = SGD(); if amp:
        opt = LossScaleOptimizer(opt)`): legacy code reads `opt.loss_scale`
        only where it is the wrapper. `<anything>.optimizer` assigned nowhere
        in the module is a Keras model's optimizer, which counts the same.
        """
        if isinstance(node, cst.Attribute) and node.attr.value == (
                "optimizer") and not self.reaching(node):
            return True
        kinds = self._possible_kinds(node)
        return bool(kinds & set(_LOSS_SCALE_KINDS)) and kinds <= {
            *_LOSS_SCALE_KINDS, Kind.KERAS_OPTIMIZER}

    def may_be_experimental(self, node: cst.BaseExpression) -> bool:
        """True if `node` may be TF 2.1-2.3's experimental optimizer.

        Also a model's `.optimizer` (assigned nowhere in the module) where
        the module sets a TF 2.1-2.3 policy, whose compile wrapped in it.
        """
        if isinstance(node, cst.Attribute) and node.attr.value == (
                "optimizer") and not self.reaching(node):
            return self._sets_legacy_policy()
        return Kind.EXPERIMENTAL_OPTIMIZER in self._possible_kinds(node)

    def scaling_seen(self, call: cst.Call) -> bool:
        """True if the module calls a scaling method on what `call` makes.

        `get_scaled_loss`, `get_unscaled_gradients` or `minimize` on the
        name `call` is assigned to, or on a model's `.optimizer` (assigned
        nowhere in the module), which may hold it. Only then
        does the current class train as the experimental one did: the two
        differ on gradients applied with neither scaling call (TF 2.4's
        class took them as unscaled, Keras 3's flavour takes them as
        scaled).
        """
        targets = set(self._syntax.call_targets.get(id(call), ()))
        for other in self._syntax.calls:
            func = other.func
            if not (isinstance(func, cst.Attribute)
                    and func.attr.value in _SCALING_METHODS):
                continue
            receiver = func.value
            if code(receiver) in targets or self._is_models_optimizer(
                    receiver):
                return True
        return False

    def model_optimizer_scaling_calls(self) -> List[cst.Call]:
        """`<x>.optimizer.get_scaled_loss(...)` and the like: calls of the
        loss-scale optimizer's own methods on a model's optimizer."""
        return [call for call in self._syntax.calls
                if isinstance(call.func, cst.Attribute)
                and call.func.attr.value in _SCALING_METHODS
                and self._is_models_optimizer(call.func.value)]

    def _is_models_optimizer(self, node: cst.BaseExpression) -> bool:
        """`<x>.optimizer`, assigned nowhere in the module."""
        return isinstance(node, cst.Attribute) and (
            node.attr.value == "optimizer") and not self.reaching(node)

    def may_be_policy(self, node: cst.BaseExpression) -> bool:
        return Kind.POLICY in self._possible_kinds(node)

    def _sets_legacy_policy(self) -> bool:
        return any(self._name_of(call.func) == _LEGACY_SET_POLICY
                   for call in self._syntax.calls)

    def _possible_kinds(self, node: cst.BaseExpression) -> Set[Kind]:
        """The kinds `node` may have, one per assignment that reaches it."""
        if isinstance(node, (cst.Name, cst.Attribute)):
            values = self.reaching(node)
            if values:
                return {self._kind(v, frozenset({id(node)})) for v in values}
        return {self.kind(node)}

    @staticmethod
    def rewrite_optimizer(node: cst.Call) -> Optional[cst.BaseExpression]:
        """The `opt` argument of an `enable_mixed_precision_graph_rewrite`."""
        try:
            bound = bind(node.args, ("opt", "loss_scale"),
                         "enable_mixed_precision_graph_rewrite")
        except Unconvertible:
            return None
        return node.args[bound["opt"]].value if "opt" in bound else None

    # How to spell TensorFlow's namespaces in this module.

    def reference(self, path: str) -> str:
        """`path` (e.g. "keras.optimizers.get") under a module alias.

        Uses an alias the module already has for `tensorflow` (or for
        `tensorflow.keras` when `path` is under `keras`, or a
        `tensorflow.compat` alias for `config`); otherwise spells it
        `tensorflow.<path>` and records that `import tensorflow` is needed.
        """
        aliases = self._syntax.aliases
        head, _, rest = path.partition(".")
        wanted = {"tensorflow": path, "tensorflow.compat.v2": path}
        if head == "keras":
            wanted["tensorflow.keras"] = rest
            wanted["tensorflow.compat.v1.keras"] = rest
            wanted["tensorflow.compat.v2.keras"] = rest
        if head in ("config", "keras"):
            wanted["tensorflow.compat.v1"] = path
        for local, module in sorted(aliases.items()):
            if module in wanted:
                tail = wanted[module]
                return f"{local}.{tail}" if tail else local
        self.imports_needed.add("tensorflow")
        return f"tensorflow.{path}"
