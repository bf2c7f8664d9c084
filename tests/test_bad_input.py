"""Every bad input in README's table raises what the table says, and changes
nothing.

The table in README's `bad-input` section is the one list: each row names
the kind of bad input, the call, the exception type and parts of the
message. This module parses it, runs each call in a namespace of freshly
made objects (the names README lists), and compares the bytes of every
variable, the optimizers' configs and the global dtype policy before and
after.
"""

import builtins
import re
import warnings
from pathlib import Path
from typing import Dict, List, NamedTuple

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_lossscale
from tf_lossscale import experimental

README = Path(__file__).resolve().parents[1] / "README.md"

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


def snapshot(namespace) -> Dict[str, object]:
    """Bytes of every variable reachable from the namespace, and configs."""
    opt, keras_lso, dls = (namespace["opt"], namespace["keras_lso"],
                           namespace["dls"])
    variables = {
        "var": namespace["var"], "other_var": namespace["other_var"],
        "dls.scale": dls(), "dls.good_steps": dls.good_steps,
        **{f"opt.{v.path}": v for v in opt.variables},
        **{f"keras_lso.{v.path}": v for v in keras_lso.variables},
        **{f"sgd.{v.path}": v for v in namespace["sgd"].variables},
    }
    state = {name: np.asarray(v).tobytes() for name, v in variables.items()}
    state["configs"] = repr([opt.get_config(), namespace["sgd"].get_config(),
                             namespace["v1_opt"].loss_scale.get_config()])
    state["policy"] = keras.mixed_precision.global_policy().name
    return state


def test_table_covers_every_kind_of_bad_input():
    assert len(ROWS) >= 50
    assert REQUIRED_KINDS <= {row.kind for row in ROWS}
    assert len({row.call for row in ROWS}) == len(ROWS), "duplicate calls"
    for row in ROWS:
        assert isinstance(getattr(builtins, row.raises, None), type), row
        assert row.fragments, row


@pytest.mark.parametrize("row", ROWS, ids=[r.call for r in ROWS])
def test_bad_input_raises_the_documented_error_and_changes_nothing(
        row, mirrored_strategy):
    namespace = make_namespace(mirrored_strategy)
    before = snapshot(namespace)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(Exception) as raised:
            exec(row.call, namespace)  # noqa: S102 (README's own calls)
    error = raised.value
    after = snapshot(namespace)
    problems = []
    if type(error) is not getattr(builtins, row.raises):
        problems.append(f"raised {type(error).__name__}, not {row.raises}")
    missing = [f for f in row.fragments if f not in str(error)]
    if missing:
        problems.append(f"the message lacks {missing}")
    changed = sorted(k for k in before if before[k] != after.get(k))
    if changed:
        problems.append(f"it changed {changed}")
    assert not problems, (
        f"{row.call}: {'; '.join(problems)}. The error: "
        f"{type(error).__name__}: {error}")
