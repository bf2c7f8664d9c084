"""The wall: every private TensorFlow, Keras 3 and tf_keras name the package
uses is in `_tf_private.py`, and each one still exists on the installed
frameworks (a test that fails names the framework and its version).

Outside the wall a module may define a framework's protocol method (the
framework calls it on our object, so it keeps the framework's name), but
imports no private framework module and reads no private attribute of a
framework object.
"""

from __future__ import annotations

import ast
import pathlib

import keras
import pytest
import tensorflow as tf

from tf_lossscale import _tf_private

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "tf_lossscale"
_PRIVATE_MODULES = ("tensorflow.python", "tensorflow.core", "keras.src",
                    "tf_keras.src")
# Protocol methods frameworks call on our classes: defined (and forwarded to
# the inner optimizer) under the framework's own names.
_PROTOCOL = {"_create_or_restore_slot_variable", "_aggregate_gradients",
             "_create_all_weights", "_restore_slot_variable",
             "_compute_gradients", "_get_hyper", "_set_hyper",
             "_trackable_children", "_lookup_dependency",
             "_serialize_to_tensors", "_restore_from_tensors",
             "_deferred_dependencies", "_checkpoint_dependencies"}
# Private-looking names that are documented public API of the standard
# library: `sys._getframe`, a namedtuple's `_replace`.
_DOCUMENTED = {"_getframe", "_replace"}


def _modules_outside_the_wall():
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name != "_tf_private.py":
            yield path


def _private_imports(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            if name.startswith(_PRIVATE_MODULES):
                yield node.lineno, name


def test_no_module_outside_the_wall_imports_a_private_framework_module():
    found = [f"{path.relative_to(PACKAGE)}:{line}: {name}"
             for path in _modules_outside_the_wall()
             for line, name in _private_imports(ast.parse(path.read_text()))]
    assert found == []


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _own_private_names() -> set:
    """Private names the package defines: functions, classes, attributes
    assigned on any object, class-level names."""
    names = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                 ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(
                    node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx,
                                                           ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.AnnAssign) and isinstance(
                    node.target, ast.Name):
                names.add(node.target.id)
    return {n for n in names if _is_private(n)} - _PROTOCOL


def _is_own_object(value: ast.AST) -> bool:
    """`self`, `cls` or `super()`: the object whose class defines the name."""
    if isinstance(value, ast.Name):
        return value.id in ("self", "cls")
    return (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
            and value.func.id == "super")


def _foreign_private_reads(tree: ast.AST, own: set):
    """`x._name` and `getattr(x, "_name"...)` where `x` is another object and
    `_name` is not one of the package's own names (or is a framework's
    protocol name, which only the framework implements)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            if _is_own_object(node.value):
                continue
            name = node.attr
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr", "setattr")
              and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str)
              and _is_private(node.args[1].value)):
            name = node.args[1].value
        else:
            continue
        if name not in own and name not in _DOCUMENTED:
            yield node.lineno, name


def test_no_module_outside_the_wall_reads_a_private_framework_name():
    own = _own_private_names()
    found = [f"{path.relative_to(PACKAGE)}:{line}: {name}"
             for path in _modules_outside_the_wall()
             for line, name in _foreign_private_reads(
                 ast.parse(path.read_text()), own)]
    assert found == []


def test_the_read_check_sees_a_private_framework_read():
    tree = ast.parse(
        "def f(self, inner):\n"
        "    self._own()\n"
        "    inner._aggregate_gradients(x)\n"
        "    self.inner_optimizer._hyper\n"
        "    getattr(inner, '_iterations', None)\n"
        "    opt._own\n")
    assert sorted(_foreign_private_reads(tree, {"_own"})) == [
        (3, "_aggregate_gradients"), (4, "_hyper"), (5, "_iterations")]


def test_the_import_check_sees_a_private_import():
    tree = ast.parse("from tf_keras.src.x import y\nimport keras.src.z\n")
    assert [n for _, n in _private_imports(tree)] == ["tf_keras.src.x",
                                                      "keras.src.z"]


@pytest.mark.parametrize("name, framework", [
    ("strategy_supports_no_merge_call", tf),
    ("in_xla_context", tf),
    ("is_reference_variable", tf),
    ("mixed_precision_graph_rewrite_state", tf),
    ("keras_saveable", keras),
])
def test_each_private_name_still_exists(name, framework):
    """Calling each accessor reaches the private name it wraps."""
    accessor = getattr(_tf_private, name)
    try:
        if name in ("is_reference_variable",):
            result = accessor(tf.Variable(1.0))
            assert result is False
        else:
            result = accessor()
    except (AttributeError, ImportError) as error:  # pragma: no cover
        pytest.fail(f"{name} is gone from {framework.__name__} "
                    f"{framework.__version__}: {error}")
    if name == "mixed_precision_graph_rewrite_state":
        assert hasattr(result, "is_mixed_precision_graph_rewrite_enabled")
    if name == "keras_saveable":
        assert isinstance(result, type)


def test_tf_keras_private_bases_still_exist():
    tf_keras = pytest.importorskip("tf_keras")
    try:
        v2, v3 = _tf_private.tf_keras_loss_scale_optimizer_bases()
    except (AttributeError, ImportError) as error:  # pragma: no cover
        pytest.fail(f"tf_keras {tf_keras.__version__} no longer has its "
                    f"loss-scale optimizer classes: {error}")
    assert issubclass(v2, tf_keras.mixed_precision.LossScaleOptimizer)
    assert issubclass(v3, tf_keras.mixed_precision.LossScaleOptimizer)
    legacy = tf_keras.optimizers.legacy.SGD()
    for attribute in ("_aggregate_gradients",
                      "_transform_unaggregated_gradients"):
        assert callable(getattr(legacy, attribute)), (
            f"tf_keras {tf_keras.__version__} has no {attribute}")


def test_tf_keras_optimizer_v2_protocol_accessors_reach_the_framework():
    """Each OptimizerV2 accessor of the wall on a real legacy optimizer."""
    tf_keras = pytest.importorskip("tf_keras")
    version = f"tf_keras {tf_keras.__version__}"
    sgd = tf_keras.optimizers.legacy.SGD(learning_rate=0.5, momentum=0.9)
    variable = tf.Variable([1.0, 2.0])
    try:
        assert set(_tf_private.tf_keras_hyperparameters(sgd)) >= {
            "learning_rate", "momentum"}
        _tf_private.tf_keras_set_hyper(sgd, "learning_rate", 0.25)
        assert float(_tf_private.tf_keras_get_hyper(
            sgd, "learning_rate", tf.float32)) == 0.25
        _tf_private.tf_keras_create_all_weights(sgd, [variable])
        assert sgd.get_slot(variable, "momentum").shape == (2,)
        pairs = _tf_private.tf_keras_compute_gradients(
            sgd, lambda: tf.reduce_sum(variable * variable), [variable])
        assert pairs[0][0].numpy().tolist() == [2.0, 4.0]
        summed = _tf_private.tf_keras_sum_gradients(sgd, pairs)
        assert summed[0][0].numpy().tolist() == [2.0, 4.0]
        for protocol in ("_create_or_restore_slot_variable",
                         "_restore_slot_variable"):
            assert callable(getattr(sgd, protocol)), protocol
    except (AttributeError, TypeError) as error:  # pragma: no cover
        pytest.fail(f"{version} changed OptimizerV2's protocol: {error}")
    assert _tf_private.tf_keras_hyperparameters(object()) == {}


def test_keras_model_loss_is_fit_s_loss():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(loss="mse")
    x = tf.constant([[1.0, 2.0]])
    y = tf.constant([[3.0]])
    y_pred = model(x)
    loss = _tf_private.keras_model_loss(model, x, y, y_pred, None)
    expected = float(tf.reduce_mean(tf.square(y - y_pred)))
    assert float(loss) == pytest.approx(expected, rel=1e-6)


def test_keras_trainable_variables_is_what_build_was_given():
    variable = keras.Variable([1.0])
    optimizer = keras.optimizers.SGD()
    optimizer.build([variable])
    assert list(_tf_private.keras_trainable_variables(optimizer)) == [
        variable]
