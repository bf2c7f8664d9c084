"""Every bad input in README's table raises what the table says, and changes
nothing.

The table in README's `bad-input` section is the one list: each row names
the kind of bad input, the call, the exception type and parts of the
message. This module parses it, runs each call in a namespace of freshly
made objects (the names README lists), and compares the bytes of every
variable, the optimizers' configs and the global dtype policy before and
after. Rows that use tf_keras run in one process of their own with
TF_USE_LEGACY_KERAS=1: this file, run as a script, prints their outcomes.
"""

import builtins
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_lossscale
from tf_lossscale import experimental

README = Path(__file__).resolve().parents[1] / "docs" / "errors.md"

# The kinds of bad input the table must cover (first column).
REQUIRED_KINDS = {
    "wrong type", "bool", "NaN scale", "Inf scale", "negative scale",
    "zero scale", "growth steps < 1", "multiplier <= 1", "wrapping twice",
    "not an optimizer", "unknown loss_scale string", "truncated config",
    "unknown config", "update in a replica context",
    "grads and vars of different lengths", "gradient of the wrong shape",
}


class Row(NamedTuple):
    kind: str
    call: str
    raises: str
    fragments: List[str]


def _code_spans(cell: str) -> List[str]:
    return re.findall(r"`([^`]*)`", cell)


def readme_rows() -> List[Row]:
    """The rows of the table in README's bad-input section."""
    text = README.read_text()
    start = text.index("<!-- section:bad-input -->")
    end = text.find("<!-- section:", start + 1)
    section = text[start:end if end != -1 else None]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) != 4 or not cells[1].startswith("`"):
            continue
        (call,), (raises,) = _code_spans(cells[1]), _code_spans(cells[2])
        fragments = [part.strip() for span in _code_spans(cells[3])
                     for part in span.split("…") if part.strip()]
        rows.append(Row(cells[0], call, raises, fragments))
    return rows


ROWS = readme_rows()


def uses_tf_keras(row: Row) -> bool:
    return bool(re.search(r"\btf_keras\.|\btk_", row.call))


KERAS3_ROWS = [row for row in ROWS if not uses_tf_keras(row)]
TF_KERAS_ROWS = [row for row in ROWS if uses_tf_keras(row)]


def make_namespace(strategy) -> Dict[str, object]:
    """The objects README's calls use, made afresh for each row."""
    var = keras.Variable([1.0, 2.0], name="var")
    opt = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.SGD(0.1, momentum=0.9), initial_scale=8.0,
        dynamic_growth_steps=2)
    opt.apply_gradients([(tf.constant([8.0, 8.0]), var)])
    dls = tf_lossscale.DynamicLossScale(8.0, 2)
    dls.update([tf.constant(1.0)])
    sgd = keras.optimizers.SGD(0.1)
    return {
        "tf": tf, "keras": keras, "np": np, "tf_lossscale": tf_lossscale,
        "experimental": experimental, "nan": float("nan"),
        "inf": float("inf"), "strategy": strategy,
        "sgd": sgd, "sgd_config": keras.optimizers.serialize(sgd),
        "var": var, "other_var": keras.Variable([0.0], name="other_var"),
        "opt": opt, "dls": dls,
        "keras_lso": keras.mixed_precision.LossScaleOptimizer(
            keras.optimizers.SGD(0.1)),
        "v1_sgd": tf.compat.v1.train.GradientDescentOptimizer(0.1),
        "v1_opt": tf_lossscale.MixedPrecisionLossScaleOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(0.1), "dynamic"),
    }


def make_tf_keras_namespace(strategy) -> Dict[str, object]:
    """The tf_keras objects README's calls use (TF_USE_LEGACY_KERAS=1)."""
    import tf_keras
    tk_var = tf.Variable([1.0, 2.0], name="tk_var")
    tk_opt = tf_lossscale.LossScaleOptimizer(
        tf_keras.optimizers.SGD(0.1, momentum=0.9), initial_scale=8.0,
        dynamic_growth_steps=2)
    tk_opt.apply_gradients([(tf.constant([8.0, 8.0]), tk_var)])
    tk_sgd = tf_keras.optimizers.SGD(0.1)
    return {
        "tf": tf, "tf_keras": tf_keras, "np": np,
        "tf_lossscale": tf_lossscale, "nan": float("nan"),
        "strategy": strategy, "tk_var": tk_var, "tk_opt": tk_opt,
        "tk_sgd": tk_sgd,
        "tk_sgd_config": tf_keras.optimizers.serialize(tk_sgd),
        "tk_lso": tf_keras.mixed_precision.LossScaleOptimizer(
            tf_keras.optimizers.SGD(0.1)),
    }


def _variables(optimizer) -> list:
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


def _name(variable) -> str:
    return getattr(variable, "path", None) or variable.name


def snapshot(namespace) -> Dict[str, object]:
    """Bytes of every variable reachable from the namespace, the configs of
    the optimizers and loss scales, and the global dtype policy."""
    variables, configs = {}, []
    for key, value in sorted(namespace.items()):
        if isinstance(value, tf.Variable) or isinstance(value,
                                                       keras.Variable):
            variables[key] = value
        elif isinstance(value, tf_lossscale.DynamicLossScale):
            variables[f"{key}.scale"] = value()
            variables[f"{key}.good_steps"] = value.good_steps
        elif hasattr(value, "get_config") and key not in ("tf", "keras"):
            configs.append(repr(value.get_config()) if not isinstance(
                value, tf.compat.v1.train.Optimizer) else key)
            if hasattr(value, "variables") and not isinstance(
                    value, tf.compat.v1.train.Optimizer):
                for v in _variables(value):
                    variables[f"{key}.{_name(v)}"] = v
    state = {name: np.asarray(v).tobytes() for name, v in variables.items()}
    state["configs"] = configs
    state["v1_loss_scale"] = repr(
        namespace["v1_opt"].loss_scale.get_config()
        if "v1_opt" in namespace else None)
    state["policy"] = keras.mixed_precision.global_policy().name
    return state


def outcome(row: Row, make: Callable[[], Dict[str, object]]) -> List[str]:
    """Runs one row on fresh objects; returns what is wrong (nothing: [])."""
    namespace = make()
    before = snapshot(namespace)
    error = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            exec(row.call, namespace)  # noqa: S102 (README's own calls)
        except Exception as e:  # noqa: BLE001 (any type is checked below)
            error = e
    if error is None:
        return ["it raised nothing"]
    after = snapshot(namespace)
    problems = []
    # The documented type or a subclass (ReplicaContextError is both a
    # RuntimeError and a ValueError, as the two originals raise).
    if not isinstance(error, getattr(builtins, row.raises)):
        problems.append(f"raised {type(error).__name__}, not {row.raises}")
    missing = [f for f in row.fragments if f not in str(error)]
    if missing:
        problems.append(f"the message lacks {missing}")
    changed = sorted(k for k in before if before[k] != after.get(k))
    if changed:
        problems.append(f"it changed {changed}")
    if problems:
        problems.append(f"the error: {type(error).__name__}: {error}")
    return problems


def test_table_covers_every_kind_of_bad_input():
    assert len(ROWS) >= 50
    assert REQUIRED_KINDS <= {row.kind for row in ROWS}
    assert len({row.call for row in ROWS}) == len(ROWS), "duplicate calls"
    for row in ROWS:
        assert isinstance(getattr(builtins, row.raises, None), type), row
        assert row.fragments, row


def test_a_call_that_changes_state_before_raising_is_caught(
        mirrored_strategy):
    """The check itself can fail: a step, then an error, is reported."""
    row = Row("meta", "opt.apply_gradients([(tf.constant([1.0, 1.0]), var)])"
              "; dls.update([tf.constant(nan)]); raise ValueError('late')",
              "ValueError", ["late"])
    problems = outcome(row, lambda: make_namespace(mirrored_strategy))
    assert len(problems) == 2 and problems[0].startswith("it changed"), (
        problems)
    for name in ("var", "dls.scale", "opt.loss_scale_optimizer"):
        assert name in problems[0], problems


@pytest.mark.parametrize("row", KERAS3_ROWS, ids=[r.call for r in KERAS3_ROWS])
def test_bad_input_raises_the_documented_error_and_changes_nothing(
        row, mirrored_strategy):
    problems = outcome(row, lambda: make_namespace(mirrored_strategy))
    assert not problems, f"{row.call}: " + "; ".join(problems)


@pytest.fixture(scope="module")
def tf_keras_outcomes() -> Dict[str, List[str]]:
    """Outcomes of the tf_keras rows, from one TF_USE_LEGACY_KERAS=1 run."""
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run([sys.executable, __file__], env=env,
                            capture_output=True, text=True, timeout=300)
    lines = [line for line in result.stdout.splitlines()
             if line.startswith("OUTCOMES ")]
    assert result.returncode == 0 and lines, (
        result.stdout[-3000:] + result.stderr[-5000:])
    return json.loads(lines[-1][len("OUTCOMES "):])


@pytest.mark.parametrize("row", TF_KERAS_ROWS,
                         ids=[r.call for r in TF_KERAS_ROWS])
def test_tf_keras_bad_input_raises_the_documented_error_and_changes_nothing(
        row, tf_keras_outcomes):
    problems = tf_keras_outcomes[row.call]
    assert not problems, f"{row.call}: " + "; ".join(problems)


def _tf_keras_main() -> int:
    """Runs the tf_keras rows here; prints {call: problems} as JSON."""
    assert os.environ.get("TF_USE_LEGACY_KERAS") == "1"
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    outcomes = {row.call: outcome(
        row, lambda: make_tf_keras_namespace(strategy))
        for row in TF_KERAS_ROWS}
    print("OUTCOMES " + json.dumps(outcomes), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_tf_keras_main())
