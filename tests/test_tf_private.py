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
             "_trackable_children", "_lookup_dependency",
             "_serialize_to_tensors", "_restore_from_tensors",
             "_deferred_dependencies", "_checkpoint_dependencies"}


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


def test_keras_trainable_variables_is_what_build_was_given():
    variable = keras.Variable([1.0])
    optimizer = keras.optimizers.SGD()
    optimizer.build([variable])
    assert list(_tf_private.keras_trainable_variables(optimizer)) == [
        variable]
