"""What the rewriter knows about a module before it changes anything.

A legacy script often says what an object is on one line and uses it on
another: `opt = tf.keras.optimizers.SGD()` ... `model.compile(optimizer=opt)`,
or `mixed_precision.set_policy('mixed_float16')` far above the `compile` it
governs. `Facts` answers the questions the call rules ask, from one plain
pass over the module:

- `kind(expr)`: is it a Keras optimizer, a `tf.compat.v1` optimizer, a
  loss-scale optimizer (TF 2.1-2.3's experimental one in particular), a dtype
  policy, a string, or unknown? A name is what every assignment to it in the
  module that reaches it makes, the name found as Python finds it (its
  function's, an enclosing function's, the module's; `global` honoured; a
  parameter is unknown); `a.b` by its text across the module.
- `qualified_name(node)` (on `_Syntax`): the imported name a dotted name
  refers to, the same lookup, without libcst's scope metadata.
- `compile_scaling()`: the loss scaling that `model.compile` added
  implicitly, from the global policies the module sets.
- `reference(...)`: how to spell `tf.config` or `tf.keras` in this module.
"""

from __future__ import annotations

import bisect
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
    ALONE,
    CompileScaling,
    CompileScalingFacts,
    Run,
    Scaling,
)
from tf_lossscale.compat.rewrite.syntax import (
    Unconvertible,
    bind,
    code,
)
from tf_lossscale.compat.rewrite.walk import Walk

__all__ = ["Facts", "Kind", "Run", "Scaling", "collect"]

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
# The methods that mark the gradients an `apply_gradients` after them in the
# same function gets (`minimize` marks only its own).
_MARKING_METHODS = ("get_scaled_loss", "get_unscaled_gradients")
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


# What a parameter, loop or `with` target is bound to: nothing known.
_UNKNOWN_VALUE = cst.Ellipsis()
_MODULE = 0  # The module's scope; a function's or class's is its node id.
# A binding: (scope, name) for a name; (-1, text) for `a.b` (by text).
Binding = Tuple[int, str]


class _Syntax:
    """One pass over the module (`walk.Walk`): bindings, calls and module
    aliases.

    Each name, attribute and call gets an order (visit order), its enclosing
    blocks and its scope, so that `Facts` can tell which assignments reach
    it: a name is looked up as Python does (the function's own, then the
    enclosing functions', then the module's; `global` honoured), an
    attribute `a.b` by its text across the module.
    """

    def __init__(self) -> None:
        self.assigned: Dict[Binding, List[_Assignment]] = {}
        self.calls: List[cst.Call] = []
        # id(call) -> the bindings of the assignment it is in, if any.
        self.call_targets: Dict[int, Tuple[Binding, ...]] = {}
        self._targets: List[Tuple[Binding, ...]] = []
        self.aliases: Dict[str, str] = {}  # local name -> module imported
        self.positions: Dict[int, Tuple[int, Tuple[int, ...], int]] = {}
        self._blocks: List[int] = []
        self._order = 0
        self._depth = 0  # of function and class bodies
        self._scopes: List[int] = [_MODULE]
        self.parent: Dict[int, int] = {}
        self.classes: Set[int] = set()
        self.globals: Dict[int, Set[str]] = {}
        # ids of the calls in a branch (if, loop, except) of their scope.
        self.conditional: Set[int] = set()
        self._branches: List[int] = [0]
        # Names bound by import statements (any scope) -> modules.
        self.imported: Dict[Binding, Set[str]] = {}
        # ids of the expressions assigned to or deleted (not read).
        self.stores: Set[int] = set()
        # ids of Name nodes that name no variable (`b` in `a.b`, keywords).
        self.not_names: Set[int] = set()

    def _mark(self, node: cst.CSTNode) -> None:
        self._order += 1
        self.positions[id(node)] = (self._order, tuple(self._blocks),
                                    self._scopes[-1])

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self._blocks.append(id(node))

    def leave_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self._blocks.pop()

    def _enter_scope(self, node: cst.CSTNode) -> None:
        self._depth += 1
        self._branches.append(0)
        self.parent[id(node)] = self._scopes[-1]
        self._scopes.append(id(node))

    def _leave_scope(self) -> None:
        self._depth -= 1
        self._branches.pop()
        self._scopes.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._enter_scope(node)

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._leave_scope()

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._enter_scope(node)
        self.classes.add(id(node))

    def leave_ClassDef(self, node: cst.ClassDef) -> None:
        self._leave_scope()

    def visit_Global(self, node: cst.Global) -> None:
        self.globals.setdefault(self._scopes[-1], set()).update(
            item.name.value for item in node.names)

    def visit_Param(self, node: cst.Param) -> None:
        self._bind(node.name, _UNKNOWN_VALUE)

    def visit_Name(self, node: cst.Name) -> None:
        self._mark(node)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._mark(node)
        self.not_names.add(id(node.attr))

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None:
            self.not_names.add(id(node.keyword))

    def _enter_branch(self, node: cst.CSTNode) -> None:
        self._branches[-1] += 1

    def _leave_branch(self, node: cst.CSTNode) -> None:
        self._branches[-1] -= 1

    def visit_If(self, node: cst.If) -> None:
        self._enter_branch(node)

    def leave_If(self, node: cst.If) -> None:
        self._leave_branch(node)

    def visit_While(self, node: cst.While) -> None:
        self._enter_branch(node)

    def leave_While(self, node: cst.While) -> None:
        self._leave_branch(node)

    def visit_For(self, node: cst.For) -> None:
        self._enter_branch(node)

    def visit_ExceptHandler(self, node: cst.ExceptHandler) -> None:
        self._enter_branch(node)

    def leave_ExceptHandler(self, node: cst.ExceptHandler) -> None:
        self._leave_branch(node)

    def visit_Call(self, node: cst.Call) -> None:
        self._mark(node)
        self.calls.append(node)
        if self._branches[-1]:
            self.conditional.add(id(node))
        if self._targets:
            self.call_targets[id(node)] = self._targets[-1]

    def _binding(self, target: cst.BaseExpression) -> Optional[Binding]:
        """Where assigning to `target` here binds it."""
        if isinstance(target, cst.Name):
            scope = self._scopes[-1]
            if target.value in self.globals.get(scope, ()):
                scope = _MODULE
            return scope, target.value
        if isinstance(target, cst.Attribute):
            return -1, code(target)
        return None

    def visit_Assign(self, node: cst.Assign) -> None:
        self._targets.append(tuple(
            b for b in map(self._binding, (t.target for t in node.targets))
            if b is not None))

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._store(node.target)
        binding = self._binding(node.target)
        self._targets.append(() if binding is None else (binding,))

    def leave_Assign(self, node: cst.Assign) -> None:
        self._targets.pop()
        for target in node.targets:
            self._bind(target.target, node.value)

    def leave_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._targets.pop()
        if node.value is not None:
            self._bind(node.target, node.value)

    def leave_For(self, node: cst.For) -> None:
        self._leave_branch(node)
        self._store(node.target)
        self._bind_all(node.target)

    def leave_WithItem(self, node: cst.WithItem) -> None:
        if node.asname is not None:
            self._store(node.asname.name)
            self._bind_all(node.asname.name)

    def _bind_all(self, target: cst.BaseExpression) -> None:
        """Binds every name of a loop or `with` target to nothing known."""
        if isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._bind_all(element.value)
        else:
            self._bind(target, _UNKNOWN_VALUE)

    def _bind(self, target: cst.BaseExpression,
              value: cst.BaseExpression) -> None:
        binding = self._binding(target)
        if binding is not None:
            self._order += 1
            self.assigned.setdefault(binding, []).append(
                _Assignment(value, self._order, tuple(self._blocks)))

    def scope_of(self, name: str, scope: int) -> Optional[int]:
        """The scope a read of `name` in `scope` finds it bound in."""
        if name in self.globals.get(scope, ()):
            scope = _MODULE
        first = True
        while True:
            if (scope, name) in self.assigned and (
                    first or scope not in self.classes):
                return scope
            if scope == _MODULE:
                return None
            scope, first = self.parent[scope], False

    def binding_of(self, node: cst.BaseExpression) -> Optional[Binding]:
        """The binding a read of `node` (a name or `a.b`) refers to."""
        if isinstance(node, cst.Attribute):
            return -1, code(node)
        if not isinstance(node, cst.Name):
            return None
        position = self.positions.get(id(node))
        if position is None:
            return None
        scope = self.scope_of(node.value, position[2])
        return None if scope is None else (scope, node.value)

    def _import(self, local: str, module: str) -> None:
        self.imported.setdefault(
            self._binding(cst.Name(local)) or (_MODULE, local),
            set()).add(module)
        if not self._depth:
            self.aliases[local] = module

    def visit_Import(self, node: cst.Import) -> bool:
        for alias in node.names:
            module = code(alias.name)
            if alias.asname is not None:
                self._import(code(alias.asname.name), module)
            else:
                head = module.split(".")[0]
                self._import(head, head)
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        if node.relative or node.module is None or (
                isinstance(node.names, cst.ImportStar)):
            return False
        for alias in node.names:
            local = code(alias.asname.name if alias.asname else alias.name)
            self._import(local, f"{code(node.module)}.{code(alias.name)}")
        return False

    def qualified_name(self, node: cst.CSTNode) -> Optional[str]:
        """The imported name `node` refers to (`tensorflow.train.X` for
        `tf.train.X` after `import tensorflow as tf`), as Python would find
        the name it starts with; None if that is not bound by an import."""
        if isinstance(node, cst.Name):
            position = self.positions.get(id(node))
            if position is None or id(node) in self.not_names:
                return None
            scope = self._import_scope(node.value, position[2])
            if scope is None:
                return None
            return min(self.imported[(scope, node.value)])
        if isinstance(node, cst.Attribute):
            value = node.value
            while isinstance(value, (cst.Call, cst.Subscript)):
                value = value.func if isinstance(value, cst.Call) else (
                    value.value)
            head = self.qualified_name(value)
            return None if head is None else f"{head}.{node.attr.value}"
        return None

    def _import_scope(self, name: str, scope: int) -> Optional[int]:
        """The scope whose import binds `name` read in `scope`, if any."""
        if name in self.globals.get(scope, ()):
            scope = _MODULE
        first = True
        while True:
            if first or scope not in self.classes:
                if (scope, name) in self.imported:
                    return scope
                if (scope, name) in self.assigned:
                    return None  # bound here, and not by an import
            if scope == _MODULE:
                return None
            scope, first = self.parent[scope], False

    # Stores: what `Context.is_read` tells from a read.

    def _store(self, target: cst.BaseExpression) -> None:
        self.stores.add(id(target))
        if isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._store(element.value)
        elif isinstance(target, cst.StarredElement):
            self._store(target.value)

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._store(node.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._store(node.target)

    def visit_Del(self, node: cst.Del) -> None:
        self._store(node.target)


def collect(module: cst.Module, wanted: Callable[[str], bool] = (
        lambda name: False)) -> Tuple[_Syntax, Set[int]]:
    """The syntax facts of `module` (no metadata needed), and the ids of
    its nodes that hold a `Name` `wanted` accepts or an import
    (`Walk.marked`)."""
    syntax = _Syntax()
    walk = Walk(syntax, wanted, (cst.Import, cst.ImportFrom, cst.Module))
    walk.walk(module)
    return syntax, walk.marked


class Facts(CompileScalingFacts):
    """Answers about the module `syntax` was collected from.

    Args:
      syntax: what `collect` found.
      name_of: the qualified name an original node refers to, if imported.
    """

    def __init__(self, syntax: _Syntax, name_of: NameOf,
                 run: Run = ALONE) -> None:
        self._syntax = syntax
        self._name_of = name_of
        self.run = run
        self.scaling_elsewhere = False
        self._scaling: Optional[CompileScaling] = None
        self.scaling_sources: Set[int] = set()  # ids of Policy calls set
        self.imports_needed: Set[str] = set()
        self._orders: Dict[Binding, List[int]] = {}
        self._scaled: Optional[Set[Binding]] = None
        self._applies: Optional[bool] = None
        self._unmarked: Optional[List[cst.Call]] = None
        self._model_scaling: List[cst.Call] = []
        self._legacy_policy: Optional[bool] = None

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
        """The values assigned to `node`'s binding that may reach `node`.

        A name's binding is found as Python finds it (its function's, an
        enclosing function's, the module's); `a.b` is one binding per text
        across the module. Of its assignments: those before `node`, latest
        first, up to the first one in a block that encloses `node` (which
        always runs first); all of them if none comes before (say, a global
        read in a function defined above). A parameter, loop or `with`
        target counts as an assignment of something unknown.
        """
        binding = self._syntax.binding_of(node)
        if binding is None:
            return []
        assignments = self._syntax.assigned.get(binding)
        if not assignments:
            return []
        position = self._syntax.positions.get(id(node))
        if position is None:
            return [a.value for a in assignments]
        order, blocks, _ = position
        # Assignments are recorded in visit order: the ones before `node`.
        before = assignments[:self._before(binding, order)]
        if not before:
            return [a.value for a in assignments]
        reaching = []
        for assignment in reversed(before):
            reaching.append(assignment.value)
            if blocks[:len(assignment.blocks)] == assignment.blocks:
                break
        return reaching

    def _before(self, binding: Binding, order: int) -> int:
        orders = self._orders.get(binding)
        if orders is None:
            orders = self._orders[binding] = [
                a.order for a in self._syntax.assigned[binding]]
        return bisect.bisect_left(orders, order)

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
        binding `call` is assigned to: the same variable, as Python finds
        names (a same-named variable of another function is another one).
        Only then does the current class train as the experimental one did:
        the two differ on gradients applied with neither scaling call
        (TF 2.4's class took them as unscaled, Keras 3's flavour takes them
        as scaled). A scaling call on a model's `.optimizer` does not count:
        the rewriter cannot tell which optimizer that is, and TF 2.4's class
        (what the rewriter writes otherwise) trains as the legacy one on
        both kinds of gradients.
        """
        targets = self._syntax.call_targets.get(id(call), ())
        return any(t in self._scaled_bindings() for t in targets)

    def _scaled_bindings(self) -> Set[Binding]:
        """The bindings a scaling method is called on, found once."""
        if self._scaled is None:
            self._scaled = set()
            self._model_scaling = []
            for other in self._syntax.calls:
                func = other.func
                if not (isinstance(func, cst.Attribute)
                        and func.attr.value in _SCALING_METHODS):
                    continue
                if self._is_models_optimizer(func.value):
                    self._model_scaling.append(other)
                binding = self._syntax.binding_of(func.value)
                if binding is not None:
                    self._scaled.add(binding)
        return self._scaled

    def applies_gradients(self) -> bool:
        """True if the module calls `apply_gradients` on anything: only
        there can gradients that no scaling method marked reach a
        loss-scale optimizer made here (Keras 3's `fit` marks its own)."""
        if self._applies is None:
            self._applies = any(
                isinstance(c.func, cst.Attribute)
                and c.func.attr.value == "apply_gradients"
                for c in self._syntax.calls)
        return self._applies

    def applies_unmarked(self, call: cst.Call) -> bool:
        """True if what `call` makes may reach an `apply_gradients` in a
        function that calls neither `get_scaled_loss` nor
        `get_unscaled_gradients`.

        There its gradients come unmarked: unscaled and accumulated in one
        `tf.function`, applied in another (OpenNMT-tf, ALBERT pretraining).
        TF 2.4-2.15's class applied them as given; the current class does
        so only once `get_unscaled_gradients` has run, which a trace of the
        apply made before that cannot know. An `apply_gradients` counts
        unless its receiver is bound only to other things the module makes
        (another optimizer): a parameter, `self.x` or an unknown call's
        result may be this one.
        """
        return any(isinstance(apply.func, cst.Attribute) and self._may_hold(
            apply.func.value, call, frozenset())
            for apply in self._unmarked_applies())

    def _unmarked_applies(self) -> List[cst.Call]:
        """The `x.apply_gradients(...)` calls in a scope (function, class
        body, module) with no `get_scaled_loss` / `get_unscaled_gradients`
        call, found once."""
        if self._unmarked is None:
            marked: Set[int] = set()
            applies: List[cst.Call] = []
            for other in self._syntax.calls:
                func = other.func
                if not isinstance(func, cst.Attribute):
                    continue
                if func.attr.value in _MARKING_METHODS:
                    marked.add(self._scope(other))
                elif func.attr.value == "apply_gradients":
                    applies.append(other)
            self._unmarked = [a for a in applies
                              if self._scope(a) not in marked]
        return self._unmarked

    def _scope(self, node: cst.CSTNode) -> int:
        position = self._syntax.positions.get(id(node))
        return _MODULE if position is None else position[2]

    def _may_hold(self, node: cst.BaseExpression, call: cst.Call,
                  seen: FrozenSet[int]) -> bool:
        """True if `node` may be what `call` makes."""
        if node is call:
            return True
        if isinstance(node, (cst.Name, cst.Attribute)):
            if id(node) in seen:
                return False
            values = self.reaching(node)
            return not values or any(
                self._may_hold(v, call, seen | {id(node)}) for v in values)
        return not isinstance(node, cst.Call) or (
            self.kind(node) is Kind.UNKNOWN)

    def model_optimizer_scaling_calls(self) -> List[cst.Call]:
        """`<x>.optimizer.get_scaled_loss(...)` and the like: calls of the
        loss-scale optimizer's own methods on a model's optimizer."""
        self._scaled_bindings()
        return list(self._model_scaling)

    def _is_models_optimizer(self, node: cst.BaseExpression) -> bool:
        """`<x>.optimizer`, assigned nowhere in the module."""
        return isinstance(node, cst.Attribute) and (
            node.attr.value == "optimizer") and not self.reaching(node)

    def may_be_policy(self, node: cst.BaseExpression) -> bool:
        return Kind.POLICY in self._possible_kinds(node)

    def compiles(self) -> bool:
        """True if the module calls a `.compile(...)` method."""
        return any(isinstance(call.func, cst.Attribute)
                   and call.func.attr.value == "compile"
                   for call in self._syntax.calls)

    def is_conditional(self, call: cst.Call) -> bool:
        """True for a call in an `if`, loop or `except` of its scope."""
        return id(call) in self._syntax.conditional

    def sets_legacy_policy(self) -> bool:
        """True if the module sets a TF 2.1-2.3 (experimental) policy, or
        its compile is governed by such a policy of another module."""
        if self._sets_legacy_policy():
            return True
        self.compile_scaling()
        return self.scaling_elsewhere and self.run.legacy

    def _sets_legacy_policy(self) -> bool:
        if self._legacy_policy is None:
            self._legacy_policy = any(
                self._name_of(call.func) == _LEGACY_SET_POLICY
                for call in self._syntax.calls)
        return self._legacy_policy

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
