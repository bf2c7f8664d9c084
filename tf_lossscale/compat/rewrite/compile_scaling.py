"""The loss scaling `model.compile` added implicitly, from a module's policies.

TF 2.1-2.3's `compile` wrapped the optimizer with the loss scale of the
global `Policy`; TF 2.4-2.15's wrapped it with dynamic scaling under the
`mixed_float16` policy. `CompileScalingFacts.compile_scaling()` reads,
from every call in the module that sets the global policy, which of these
applies: a set of optimizer arguments, none, one chosen at run time by the
policy's name, or a policy the rewriter cannot read. `Facts` inherits it.
"""

from __future__ import annotations

import enum
from typing import (
    Any,
    Callable,
    Iterable,
    List,
    NamedTuple,
    Optional,
    Set,
    Tuple,
    Union,
)

import libcst as cst

from tf_lossscale.compat import legacy_names as table
from tf_lossscale.compat.rewrite import loss_scale_args
from tf_lossscale.compat.rewrite.syntax import (
    Unconvertible,
    bind,
    code,
    literal,
)

__all__ = ["ALONE", "CompileScaling", "CompileScalingFacts", "Run",
           "Scaling", "join"]


class Scaling(enum.Enum):
    """Markers for `compile_scaling()` besides a tuple of arguments."""

    NONE = "no loss scaling"
    UNKNOWN = "a policy the rewriter cannot read"
    UNSCALED_MIXED = "mixed_float16 with loss_scale=None"
    # The policy's name is chosen at run time among literals (`'mixed_float16'
    # if flags.amp else 'float32'`): compile wrapped, with the defaults, when
    # the chosen one is mixed_float16.
    IF_MIXED_FLOAT16 = "dynamic scaling if the policy set is mixed_float16"


# The optimizer arguments (keyword, source) that compile's implicit wrapper
# had, e.g. () for dynamic scaling, or a marker.
CompileScaling = Union[Tuple[Tuple[str, str], ...], Scaling]


class Run(NamedTuple):
    """What the modules of one `migrate` run say about `compile`.

    A policy is global: set in one module (`train.py` under a flag), it
    governs the `compile` of another (`model.py`). `scaling` is the join of
    what every module of the run that sets a policy gives compile (as
    `compile_scaling()`; `Scaling.NONE` if none sets one); `legacy` whether
    those policies are TF 2.1-2.3's; `compiles` whether a module of the run
    without a policy of its own calls `compile`, whose optimizer is then
    wrapped with that scaling (so a policy's `loss_scale` is carried).
    """

    scaling: CompileScaling = Scaling.NONE
    legacy: bool = False
    compiles: bool = False


# A module migrated alone: no other module sets a policy or compiles.
ALONE = Run()


def join(scalings: Iterable["CompileScaling"]) -> "CompileScaling":
    """The scaling under any of several policies: one, none, or unknown."""
    found = set(scalings)
    found.discard(Scaling.NONE)
    if len(found) > 1:
        return Scaling.UNKNOWN
    return found.pop() if found else Scaling.NONE


def _by_name(names: Set[Any]) -> CompileScaling:
    """The scaling of compile under a policy named one of `names`."""
    if names == {"mixed_float16"}:
        return ()
    if "mixed_float16" in names:
        return Scaling.IF_MIXED_FLOAT16
    return Scaling.NONE


class CompileScalingFacts:
    """The compile-scaling questions of `Facts` (a mixin: `Facts` gives
    `_calls`, `_name_of` and `reaching`)."""

    _scaling: Optional["CompileScaling"]
    scaling_sources: Set[int]
    # The run this module is migrated in, and whether compile_scaling()
    # comes from a policy its other modules set (this one sets none).
    run: Run
    scaling_elsewhere: bool
    _name_of: Callable[[cst.CSTNode], Optional[str]]

    def _calls(self) -> List[cst.Call]:
        raise NotImplementedError

    def is_conditional(self, call: cst.Call) -> bool:
        raise NotImplementedError

    def reaching(self, node: cst.BaseExpression) -> List[cst.BaseExpression]:
        raise NotImplementedError

    def compile_scaling(self) -> CompileScaling:
        """The loss scaling `model.compile` adds under this module's policy.

        From every call in the module that sets the global policy: none
        (no such call, or only policies without loss scaling), one set of
        optimizer arguments, dynamic scaling if the policy is mixed_float16
        at run time (a name chosen at run time, or a policy set in one
        branch only: `if flags.fp16: set_policy(...)`), or
        `Scaling.UNKNOWN` (a policy the rewriter cannot read, or two
        policies that scale differently).
        """
        if self._scaling is None:
            self._scaling = self._compile_scaling()
            if self._scaling is Scaling.NONE and not self._sets_policy and (
                    self.run.scaling is not Scaling.NONE):
                # No policy here: the one another module of the run sets
                # governs this module's compile, if it is set first; the
                # wrapper tests at run time that mixed_float16 is in force.
                self._scaling = self.run.scaling
                self.scaling_elsewhere = True
        return self._scaling

    _sets_policy = False

    def _compile_scaling(self) -> CompileScaling:
        found = set()
        for call in self._calls():
            name = self._name_of(call.func)
            if name in table.POLICY_SETTERS:
                self._sets_policy = True
            if name in table.POLICY_SETTERS and call.args:
                scaling = self._set_scaling(call.args[0].value)
                if self.is_conditional(call) and scaling != Scaling.NONE:
                    # Set in one branch only: compile wrapped when the
                    # policy in force was mixed_float16, which the wrapper
                    # then tests at run time; other scalings it cannot.
                    scaling = (Scaling.IF_MIXED_FLOAT16 if scaling in (
                        (), Scaling.IF_MIXED_FLOAT16) else Scaling.UNKNOWN)
                found.add(scaling)
        return join(found)

    def _set_scaling(self, policy: cst.BaseExpression) -> CompileScaling:
        """The scaling compile adds under the policy `policy` being set."""
        if isinstance(policy, cst.Name) and policy.value not in (
                "None", "True", "False"):
            values = self.reaching(policy)
            if len(values) != 1:
                return Scaling.UNKNOWN
            policy = values[0]
        if isinstance(policy, cst.Call):
            return self._policy_scaling(policy)
        names = self._policy_names(policy)
        if names is None:
            return Scaling.UNKNOWN
        # TF 2.3's set_policy(name) sets Policy(name); TF 2.4-2.15's compile
        # wraps under "mixed_float16": both scale dynamically then.
        return _by_name(names)

    def _policy_names(self, node: cst.BaseExpression,
                      depth: int = 0) -> Optional[Set[Any]]:
        """The literal values `node` may have: a literal, a conditional
        expression between literals, or a name assigned one of those once;
        None for anything else."""
        if isinstance(node, cst.IfExp) and depth < 8:
            body = self._policy_names(node.body, depth + 1)
            orelse = self._policy_names(node.orelse, depth + 1)
            return None if body is None or orelse is None else body | orelse
        if isinstance(node, cst.Name) and node.value not in (
                "None", "True", "False") and depth < 8:
            values = self.reaching(node)
            if len(values) != 1:
                return None
            return self._policy_names(values[0], depth + 1)
        try:
            return {literal(node)}
        except Unconvertible:
            return None

    def _policy_scaling(self, call: cst.Call) -> CompileScaling:
        """The scaling of a `Policy(name, loss_scale)` call being set."""
        qualified = self._name_of(call.func)
        if qualified not in table.POLICY_CLASSES:
            return Scaling.UNKNOWN
        try:
            bound = bind(call.args, ("name", "loss_scale"), "Policy")
            names = self._policy_names(call.args[bound["name"]].value)
        except (KeyError, Unconvertible):
            return Scaling.UNKNOWN
        if names is None:
            return Scaling.UNKNOWN
        if "loss_scale" not in bound:
            return _by_name(names)
        if len(names) != 1:
            return Scaling.UNKNOWN
        name = next(iter(names))
        self.scaling_sources.add(id(call))
        value = call.args[bound["loss_scale"]].value
        try:
            given = literal(value)
        except Unconvertible:
            given = value
        if isinstance(given, str) and given == "auto":
            return () if name == "mixed_float16" else Scaling.NONE
        if given is None:
            return (Scaling.UNSCALED_MIXED if name == "mixed_float16"
                    else Scaling.NONE)
        try:
            args = loss_scale_args.optimizer_args(value, value,
                                                  self._name_of)
        except Unconvertible:
            return Scaling.UNKNOWN
        return tuple((a.keyword.value, code(a.value)) for a in args
                     if a.keyword is not None)
