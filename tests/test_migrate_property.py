"""The rule of `migrate` as a property (issue 19): for generated legacy
programs (how TensorFlow is imported, how the loss-scale optimizer is
spelled and made, how its gradients flow, eager or traced), the migrated
program needs no shim and computes what the original computes under the
shim, bit for bit, or `migrate` names the lines it left."""

import math
import textwrap

import pytest
from _legacy_programs import result_of
from hypothesis import given, settings
from hypothesis import strategies as st

from tf_lossscale.compat import migrate

# How a program names TensorFlow (`tf`) and the mixed precision module.
IMPORTS = {
    "tensorflow": "import tensorflow as tf",
    "compat.v2": "import tensorflow.compat.v2 as tf",
    "from compat": "from tensorflow.compat import v2 as tf",
    "compat.v1": "import tensorflow.compat.v1 as tf",
}
MODULES = {
    "attribute": ("", "tf.keras.mixed_precision"),
    "from keras": ("from tensorflow.keras import mixed_precision",
                   "mixed_precision"),
    "keras alias": ("import tensorflow.keras as keras",
                    "keras.mixed_precision"),
}
# The optimizer, from `{mp}` (the module) and `inner`.
OPTIMIZERS = [
    "{mp}.experimental.LossScaleOptimizer(inner, 'dynamic')",
    "{mp}.experimental.LossScaleOptimizer(inner, loss_scale=1024)",
    "{mp}.experimental.LossScaleOptimizer(\n"
    "    inner, tf.train.experimental.DynamicLossScale(16, 2))",
    "{mp}.LossScaleOptimizer(inner)",
    "{mp}.LossScaleOptimizer(inner, dynamic=False, initial_scale=64)",
    "{mp}.LossScaleOptimizer(inner, initial_scale=256, "
    "dynamic_growth_steps=2)",
    "{mp}.LossScaleOptimizer(inner, False, 8)",
]
# One step on `x` (a float; NaN makes the step non-finite).
FLOWS = {
    "documented": """\
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(var * var) * x
            scaled = opt.get_scaled_loss(loss)
        grads = opt.get_unscaled_gradients(tape.gradient(scaled, [var]))
        opt.apply_gradients(zip(grads, [var]))
        """,
    "unscaled apply": """\
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(var * var) * x
        opt.apply_gradients(zip(tape.gradient(loss, [var]), [var]))
        """,
    "minimize": """\
        opt.minimize(lambda: tf.reduce_sum(var * var) * x, [var])
        """,
}
INPUTS = [0.5, float("nan"), 0.25, 1.0]


def program(imports, module, optimizer, flow, traced):
    """A legacy program whose `result` is its variable after the steps."""
    line, mp = MODULES[module]
    step = textwrap.indent(textwrap.dedent(FLOWS[flow]), "    ")
    return "\n".join(filter(None, [
        IMPORTS[imports], line,
        "inner = tf.keras.optimizers.SGD(0.1)",
        "opt = " + optimizer.format(mp=mp),
        "var = tf.Variable([1.0, -2.0])",
        "@tf.function" if traced else "",
        "def step(x):",
        step.rstrip("\n"),
        f"for x in {INPUTS!r}:".replace("nan", "float('nan')"),
        "    step(tf.constant(x))",
        "result = [float(v) for v in var.numpy()]",
    ])) + "\n"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@settings(max_examples=16, deadline=None, derandomize=True, database=None)
@given(imports=st.sampled_from(sorted(IMPORTS)),
       module=st.sampled_from(sorted(MODULES)),
       optimizer=st.sampled_from(OPTIMIZERS),
       flow=st.sampled_from(sorted(FLOWS)),
       traced=st.booleans())
def test_migrated_program_computes_as_under_the_shim_or_is_named(
        imports, module, optimizer, flow, traced):
    source = program(imports, module, optimizer, flow, traced)
    new, notes = migrate.rewrite(source)
    if notes:  # Then each names a line of the program, with a reason.
        assert all(1 <= n.line <= len(source.splitlines()) and n.reason
                   for n in notes), notes
        return
    assert "mixed_precision" not in new.replace(
        "from tensorflow.keras import mixed_precision", ""), new
    assert migrate.rewrite(new) == (new, [])
    expected = result_of(source, shim=True)
    assert all(math.isfinite(v) for v in expected)
    assert result_of(new, shim=False) == expected, new
