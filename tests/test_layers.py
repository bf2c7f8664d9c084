"""The package's imports point down: no module imports one above it.

Read with `ast` from the source (imports inside functions count too), so the
check holds for code paths no other test runs.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "tf_lossscale"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _package_imports(path: Path, modules: set) -> set:
    """Modules of tf_lossscale that `path` imports, anywhere in the file.

    `from tf_lossscale import finite` imports the module
    tf_lossscale.finite; `from tf_lossscale import get` imports the
    package's top.
    """
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            names = [f"{base}.{alias.name}"
                     if f"{base}.{alias.name}" in modules else base
                     for alias in node.names]
        else:
            continue
        found.update(n for n in names if n in modules)
    return found


def _graph() -> dict:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: _package_imports(path, set(modules)) - {name}
            for name, path in modules.items()}


def _cycle(graph: dict):
    """One import cycle as a list of modules, or None."""
    state = {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt, stack)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node, [])
            if found:
                return found
    return None


# The layers, bottom up: the core library; the top (`tf_lossscale`, the
# public names); the migration shim; the applications on the command line.
APPS = {"tf_lossscale.__main__", "tf_lossscale.bench", "tf_lossscale.cli",
        "tf_lossscale.demo"}


def _layer(name: str) -> int:
    if name in APPS:
        return 3
    if name.startswith("tf_lossscale.compat"):
        return 2
    return 1 if name == "tf_lossscale" else 0


def test_the_package_has_no_import_cycle():
    assert _cycle(_graph()) is None, _cycle(_graph())


def test_every_import_points_down_or_within_a_layer():
    for name, imports in _graph().items():
        for imported in imports:
            assert _layer(imported) <= _layer(name), (
                f"{name} (layer {_layer(name)}) imports {imported} "
                f"(layer {_layer(imported)})")


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("lower, upper", [
    ("tf_lossscale.optimizer", "tf_lossscale.keras_optimizer"),
    ("tf_lossscale.optimizer", "tf_lossscale.tf_keras_optimizer"),
    ("tf_lossscale.optimizer", "tf_lossscale.experimental"),
    ("tf_lossscale.experimental", "tf_lossscale.keras_optimizer"),
    ("tf_lossscale.finite", "tf_lossscale.distribute"),
    ("tf_lossscale.state_machine", "tf_lossscale.step"),
    ("tf_lossscale.loss_scale", "tf_lossscale.optimizer"),
    ("tf_lossscale.flavour_registry", "tf_lossscale.optimizer"),
    ("tf_lossscale.gradient_marks", "tf_lossscale.optimizer"),
    ("tf_lossscale.gradient_check", "tf_lossscale.optimizer"),
    ("tf_lossscale.inner_attribute", "tf_lossscale.optimizer"),
    ("tf_lossscale.flavour_registry", "tf_lossscale.keras_optimizer"),
    ("tf_lossscale.skip_record", "tf_lossscale.optimizer"),
    ("tf_lossscale.skip_record", "tf_lossscale.step"),
    ("tf_lossscale.telemetry", "tf_lossscale.monitor"),
    ("tf_lossscale.telemetry", "tf_lossscale.optimizer"),
    # One stop for every optimizer: it imports none of them.
    ("tf_lossscale.stop", "tf_lossscale.optimizer"),
    ("tf_lossscale.stop", "tf_lossscale.v1_optimizer"),
    ("tf_lossscale.stop", "tf_lossscale.telemetry"),
    # What both tf_keras flavours share imports neither.
    ("tf_lossscale.tf_keras_checks", "tf_lossscale.tf_keras_optimizer"),
    ("tf_lossscale.tf_keras_loss_scale_state",
     "tf_lossscale.tf_keras_optimizer"),
    ("tf_lossscale.tf_keras_legacy_delegation", "tf_lossscale.optimizer"),
    ("tf_lossscale.keras_arguments", "tf_lossscale.optimizer"),
])
def test_lower_layers_do_not_import_upper_ones(lower, upper):
    reachable, todo = set(), [lower]
    graph = _graph()
    while todo:
        for nxt in graph[todo.pop()]:
            if nxt not in reachable:
                reachable.add(nxt)
                todo.append(nxt)
    assert upper not in reachable


def test_the_layer_check_sees_an_upward_import():
    assert _layer("tf_lossscale.optimizer") < _layer("tf_lossscale.compat.shim")
    assert _layer("tf_lossscale") < _layer("tf_lossscale.cli")
