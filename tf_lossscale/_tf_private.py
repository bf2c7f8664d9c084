"""The few TensorFlow, Keras 3 and tf_keras internals this package relies
on, in one place, a section per framework: no other module imports a
private framework module or reads a private name of a framework object.
Other modules may only define the protocol methods a framework calls on
our classes (tf_keras' `_create_or_restore_slot_variable`, the Trackable
`_trackable_children`), which must keep the framework's names; where such a
method forwards to the inner optimizer, it calls the accessor here.
`tests/test_tf_private.py` checks both rules, and that each name still
exists, naming the framework version when one is gone.

`tf.train.Checkpoint` names a child by what an object's
`_trackable_children` returns. To write the same checkpoint keys as
TensorFlow's own `DynamicLossScale` (`current_loss_scale`, `good_steps`) while
keeping one pair of variables per TF1 graph, `LossScale` derives from the
base `Trackable` and overrides that protocol, exactly as TensorFlow does.
The protocol is stable since TF 2.10 but has no public spelling.
"""

import contextlib
import threading
from typing import Any, Dict, Iterator

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2 as _attr_value_pb2
from tensorflow.python.ops import control_flow_util as _control_flow_util
from tensorflow.python.platform import tf_logging as _tf_logging

Trackable = tf.__internal__.tracking.Trackable

__all__ = [
    "DelegatingTrackableMixin",
    "Trackable",
    "in_xla_context",
    "is_reference_variable",
    "is_wrapped_by_loss_scale_optimizer",
    "keras_check_variables_are_known",
    "keras_gradients_already_summed",
    "keras_iterations_variable",
    "keras_model_loss",
    "keras_saveable",
    "keras_trainable_variables",
    "mark_wrapped_by_loss_scale_optimizer",
    "mixed_precision_graph_rewrite_state",
    "no_automatic_dependency_tracking",
    "run_cond_as_one_call",
    "strategy_supports_no_merge_call",
    "tf1_control_flow",
    "tf_keras_aggregate_gradients",
    "tf_keras_compute_gradients",
    "tf_keras_create_all_weights",
    "tf_keras_create_or_restore_slot_variable",
    "tf_keras_get_hyper",
    "tf_keras_hyperparameters",
    "tf_keras_loss_scale_optimizer_bases",
    "tf_keras_restore_slot_variable",
    "tf_keras_set_hyper",
    "tf_keras_sum_gradients",
    "tf_logging_warning",
    "track_child",
    "xla_opaque",
]


# --- TensorFlow -------------------------------------------------------------

# The tf_keras LossScaleOptimizer is, to a checkpoint, its inner optimizer
# plus a `loss_scale` child: it delegates the whole trackable protocol to the
# inner optimizer with this mixin (TF's own, made for that wrapper). Ours
# does the same so that checkpoints interchange with tf_keras' and with the
# bare inner optimizer. No public spelling.
DelegatingTrackableMixin = tf.__internal__.tracking.DelegatingTrackableMixin


# Keeps attribute assignment in a method from adding checkpoint
# dependencies: on a delegating object they would land on the inner
# optimizer. No public spelling.
no_automatic_dependency_tracking = (
    tf.__internal__.tracking.no_automatic_dependency_tracking)


def strategy_supports_no_merge_call() -> bool:
    """True when the current strategy updates variables without `merge_call`.

    Keras 3 optimizers choose their update path with this predicate (through
    `tf.__internal__.distribute.interim.maybe_merge_call`); the Keras
    `LossScaleOptimizer` must choose the same one, so that its apply-or-skip
    branch sits in the context (replica or cross-replica) where the inner
    update can run. It depends on the graph being traced (XLA), so call it
    where the step is traced. No public spelling.
    """
    return tf.__internal__.distribute.strategy_supports_no_merge_call()


def in_xla_context() -> bool:
    """True while tracing code that XLA compiles whole.

    `tf.function(jit_compile=True)` (Keras' `compile(jit_compile=True)`,
    its default for `fit` on a GPU) traces its body in an XLA context; the
    step then shapes its check and its apply-or-skip for XLA's fusion
    (see `finite.py` and `distribute.branch`), and the skip record leaves
    out its check (XLA has no string op and drops assertions). TensorFlow's
    own ops ask the same question this way (`control_flow_util`); it has
    no public spelling.
    """
    if tf.executing_eagerly():
        return False
    graph = tf.compat.v1.get_default_graph()
    return bool(_control_flow_util.GraphOrParentsInXlaContext(graph))


def xla_opaque(value: tf.Tensor) -> tf.Tensor:
    """`value`, which XLA may not constant-fold through.

    XLA rewrites a division by a constant into a multiplication by its
    reciprocal: for a fixed loss scale of 2**127 the reciprocal is a
    subnormal that the CPU flushes to zero, and every unscaled gradient
    would be 0. An optimization barrier keeps the scale a runtime value
    (`XlaOptimizationBarrier`, TF >= 2.9, only in the generated tf2xla
    ops); where it is missing the value is returned as it is.
    """
    try:
        from tensorflow.compiler.tf2xla.ops import gen_xla_ops
    except ImportError:  # pragma: no cover - a TensorFlow without tf2xla ops
        return value
    barrier = getattr(gen_xla_ops, "xla_optimization_barrier", None)
    return value if barrier is None else barrier([value])[0]


def track_child(parent, child, name: str) -> None:
    """Makes `child` the checkpoint dependency `name` of `parent`.

    What an attribute assignment does on an `AutoTrackable`, without the
    attribute: the tf_keras LossScaleOptimizer adds its `loss_scale` to the
    inner optimizer this way, so the key is `loss_scale` in both. No public
    spelling.
    """
    parent._track_trackable(child, name=name)


def tf_logging_warning(message: str) -> None:
    """`tf.compat.v1.logging.warning`, looked up when called.

    tf_keras warns through this module's `warning`, and code (tf_keras' own
    tests among it) patches that attribute to see the warning; the public
    alias is bound at import time and would not be seen.
    """
    _tf_logging.warning(message)


_IF_OPS = ("If", "StatelessIf")


def run_cond_as_one_call(cond_output: tf.Tensor) -> bool:
    """Keeps the `If` op behind a traced `tf.cond` output from being lowered.

    By default TensorFlow lowers a traced `tf.cond` into Switch/Merge nodes,
    one Switch per tensor the branches capture: for an optimizer update,
    every gradient, variable and slot (about 4 per variable with Adam). Run
    as one function call instead, a step over many variables costs markedly
    less (a loop over 1500, SGD: +15.5% over the plain step instead of
    +31.8% on Keras 3, +14.2% instead of +23.3% on tf_keras). The price: a
    call holds its inputs, so the update ops in it cannot write over them
    and allocate instead: on 40 large variables that costs 3-8% of the
    update (`benchmarks/branch_cost.py`), below a `fit` step's noise, where
    lowered and one call measured the same (docs/performance-record.md,
    2026-12-05). The
    attribute is how `tf.cond` itself chooses (`_lower_using_switch_merge`);
    it has no public spelling. Under XLA and in TF1 graphs there is no such
    `If` op, and nothing changes.

    Returns:
      Whether an `If` op was found and marked.
    """
    op = cond_output.op
    for _ in range(3):  # The output may sit behind an Identity or two.
        if op.type in _IF_OPS:
            op._set_attr("_lower_using_switch_merge",
                         _attr_value_pb2.AttrValue(b=False))
            return True
        if not op.inputs:
            return False
        op = op.inputs[0].op
    return False


@contextlib.contextmanager
def tf1_control_flow() -> Iterator[None]:
    """Builds `tf.cond`s in a TF1 graph as TF1's Switch/Merge while open.

    In a TF2 process a `tf.cond` in a `tf.compat.v1.Graph` is a functional
    `If`, whose branches cannot capture a reference variable
    (`use_resource=False`, dtype float32_ref): the update op fails to build.
    TF1's control flow takes them. The switch is TensorFlow's module-level
    flag (`control_flow_util.ENABLE_CONTROL_FLOW_V2`, no public spelling
    but `tf.compat.v1.disable_control_flow_v2`, which is global); it is
    restored on exit. Inside a `tf.function` the flag is not read.
    """
    old = _control_flow_util.ENABLE_CONTROL_FLOW_V2
    _control_flow_util.ENABLE_CONTROL_FLOW_V2 = False
    try:
        yield
    finally:
        _control_flow_util.ENABLE_CONTROL_FLOW_V2 = old


def is_reference_variable(variable: Any) -> bool:
    """Whether `variable` is a TF1 reference variable (dtype float32_ref)."""
    dtype = getattr(variable, "dtype", None)
    return bool(getattr(dtype, "_is_ref_dtype", False))


def mixed_precision_graph_rewrite_state() -> Any:
    """TensorFlow's module of the graph rewrite's global flags: a TF1
    Session given its own ConfigProto turns the rewrite on only when its
    flag is set, as TensorFlow's `enable_mixed_precision_graph_rewrite` set
    it."""
    from tensorflow.python.training.experimental import (
        mixed_precision_global_state,
    )
    return mixed_precision_global_state


# --- Keras 3 ----------------------------------------------------------------

def keras_iterations_variable(optimizer):
    """The variable in which a Keras 3 optimizer counts its `apply` calls.

    `optimizer.iterations` is that variable, except with
    `gradient_accumulation_steps`, where it is a tensor derived from it. A
    skipped loss-scaled step must advance the variable itself, as `apply`
    does for an applied one. Keras keeps it as `_iterations`, with no public
    spelling.
    """
    return optimizer._iterations


def keras_check_variables_are_known(optimizer, variables) -> None:
    """Raises `ValueError` if a Keras 3 optimizer was not built on `variables`.

    The Keras `LossScaleOptimizer` checks this before its step changes any
    state (an eager step would otherwise have moved the loss scale before
    the inner optimizer raised). Keras' own check (`_check_variables_are_
    known`) knows how to key distributed and Keras variables; it has no
    public spelling.
    """
    optimizer._check_variables_are_known(variables)


_SUMMED_LOCK = threading.Lock()
_SUMMED_DEPTH: Dict[int, int] = {}


@contextlib.contextmanager
def keras_gradients_already_summed(optimizer: Any) -> Iterator[None]:
    """While tracing in it, a Keras 3 optimizer does not sum its gradients
    across replicas.

    For `apply_gradients(..., experimental_aggregate_gradients=False)`
    (TF 2.4-2.15, used by code that all-reduces the gradients itself): Keras
    3 always sums them in `_all_reduce_sum_gradients`, which has no public
    switch, so a second sum would multiply them by the replica count. An
    instance attribute shadows the method until the last replica thread
    (MirroredStrategy traces each replica in a thread) leaves.
    """
    key = id(optimizer)
    with _SUMMED_LOCK:
        _SUMMED_DEPTH[key] = _SUMMED_DEPTH.get(key, 0) + 1
        optimizer._all_reduce_sum_gradients = lambda grads_and_vars: list(
            grads_and_vars)
    try:
        yield
    finally:
        with _SUMMED_LOCK:
            _SUMMED_DEPTH[key] -= 1
            if not _SUMMED_DEPTH[key]:
                del _SUMMED_DEPTH[key]
                del optimizer._all_reduce_sum_gradients


def keras_saveable() -> type:
    """Keras 3's base of the objects a `.keras` file saves (imported when
    called: this module imports no Keras).

    Keras saves the state of every object of this type that it reaches
    through an attribute of a saved one. No public spelling.
    """
    from keras.src.saving.keras_saveable import KerasSaveable
    return KerasSaveable


def keras_trainable_variables(optimizer: Any) -> Any:
    """The variables a built Keras 3 optimizer was built with (what its
    `apply(grads)` pairs gradients with when given none)."""
    return optimizer._trainable_variables


def keras_model_loss(model: Any, x: Any, y: Any, y_pred: Any,
                     sample_weight: Any) -> Any:
    """The loss `fit`'s train step computes for a batch of a Keras 3 or
    tf_keras `model`. Keras 3's train step calls `_compute_loss`, which
    also counts the losses that layers add, with no public spelling;
    tf_keras' calls the public `compute_loss`."""
    if hasattr(model, "_compute_loss"):  # Keras 3
        return model._compute_loss(x=x, y=y, y_pred=y_pred,
                                   sample_weight=sample_weight,
                                   training=True)
    return model.compute_loss(x, y, y_pred, sample_weight)


# --- tf_keras (imported when called: tf_keras is optional) ------------------

# tf_keras marks an optimizer that a LossScaleOptimizer wraps with this
# attribute and refuses to wrap it again; ours reads and writes the same mark,
# so neither wraps an optimizer the other already wraps.
_WRAPPED_MARK = "_is_wrapped_by_loss_scale_optimizer"


def is_wrapped_by_loss_scale_optimizer(optimizer) -> bool:
    """Whether a tf_keras LossScaleOptimizer (ours or tf_keras') wraps it."""
    return bool(getattr(optimizer, _WRAPPED_MARK, False))


def mark_wrapped_by_loss_scale_optimizer(optimizer) -> None:
    """Marks `optimizer` as wrapped, as tf_keras' LossScaleOptimizer does."""
    setattr(optimizer, _WRAPPED_MARK, True)


def tf_keras_loss_scale_optimizer_bases() -> "tuple[type, type]":
    """tf_keras' own wrapper classes `(LossScaleOptimizer, LossScaleOptimizerV3)`
    for its legacy and current optimizer families.

    The tf_keras flavours derive from them so that `isinstance` checks in
    tf_keras (`model.compile` wraps an optimizer only if it is not one)
    hold; tf_keras exports only their common base.
    """
    from tf_keras.src.mixed_precision import loss_scale_optimizer as module
    return module.LossScaleOptimizer, module.LossScaleOptimizerV3


def tf_keras_aggregate_gradients(optimizer: Any, pairs: Any) -> Any:
    """What tf_keras' legacy `apply_gradients` does to its pairs before it
    applies them (clipping of unaggregated gradients, then the sum across
    replicas); no public spelling."""
    return optimizer._aggregate_gradients(
        optimizer._transform_unaggregated_gradients(pairs))


# OptimizerV2's protected protocol (tf_keras' legacy family). tf_keras'
# wrapper forwards each of these to its inner optimizer, and so does the
# legacy flavour (`tf_keras_legacy_delegation`): Keras, h5 loading and
# checkpoint restores call them on the wrapper. None has a public spelling.

def tf_keras_hyperparameters(optimizer: Any) -> Dict[str, Any]:
    """The hyperparameters an OptimizerV2 keeps (its `_hyper`), or {}."""
    hyper = getattr(optimizer, "_hyper", None)
    return hyper if isinstance(hyper, dict) else {}


def tf_keras_get_hyper(optimizer: Any, name: str, dtype: Any = None) -> Any:
    """OptimizerV2's read of hyperparameter `name` (a tensor of `dtype`
    when given)."""
    return optimizer._get_hyper(name, dtype)


def tf_keras_set_hyper(optimizer: Any, name: str, value: Any) -> None:
    """OptimizerV2's write of hyperparameter `name`."""
    optimizer._set_hyper(name, value)


def tf_keras_sum_gradients(optimizer: Any, pairs: Any) -> Any:
    """OptimizerV2's sum of `(gradient, variable)` pairs across replicas."""
    return optimizer._aggregate_gradients(pairs)


def tf_keras_compute_gradients(optimizer: Any, loss: Any, var_list: Any,
                               grad_loss: Any = None, tape: Any = None
                               ) -> Any:
    """OptimizerV2's gradients of `loss` (what `minimize` applies)."""
    return optimizer._compute_gradients(loss, var_list, grad_loss, tape=tape)


def tf_keras_create_all_weights(optimizer: Any, var_list: Any) -> None:
    """OptimizerV2's creation of its slots and `iterations` (h5 loading)."""
    optimizer._create_all_weights(var_list)


def tf_keras_create_or_restore_slot_variable(
        optimizer: Any, slot_variable_position: Any, slot_name: str,
        variable: Any) -> Any:
    """OptimizerV2's creation of a slot a checkpoint restore holds."""
    return optimizer._create_or_restore_slot_variable(
        slot_variable_position, slot_name, variable)


def tf_keras_restore_slot_variable(optimizer: Any, slot_name: str,
                                   variable: Any, slot_variable: Any) -> Any:
    """OptimizerV2's restore of a slot created before its value came."""
    return optimizer._restore_slot_variable(slot_name, variable,
                                            slot_variable)
