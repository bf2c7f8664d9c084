"""The rule of `migrate`, over every legacy spelling of the table: the
migrated program needs no shim and computes what the original computes
under the shim, or `migrate` names the line (issue 19)."""

import textwrap

import pytest
from _legacy_programs import result_of

from tf_lossscale.compat import legacy_names, migrate

# A small program per kind of legacy name ({name} is its spelling); each
# sets `result`.
PROGRAMS = {
    "LossScale": """\
        result = isinstance(tf.compat.v1.mixed_precision.FixedLossScale(2), {name})
        """,
    "FixedLossScale": """\
        result = float({name}(4)())
        """,
    "DynamicLossScale": """\
        ls = {name}(8, 100)
        ls.update([tf.constant(float('inf'))])
        result = float(ls())
        """,
    "MixedPrecisionLossScaleOptimizer": """\
        opt = {name}(tf.compat.v1.train.GradientDescentOptimizer(0.1), 'dynamic')
        var = tf.Variable(1.0)
        opt.minimize(lambda: var * 2.0, var_list=[var])
        result = float(var.numpy())
        """,
    "experimental.LossScaleOptimizer": """\
        opt = {name}(tf.keras.optimizers.SGD(0.1), 'dynamic')
        var = tf.Variable(1.0)
        opt.apply_gradients([(tf.constant(1.0), var)])
        result = float(var.numpy())
        """,
    "mixed_precision.LossScaleOptimizer": """\
        opt = {name}(tf.keras.optimizers.SGD(0.1))
        var = tf.Variable(1.0)
        with tf.GradientTape() as tape:
            loss = opt.get_scaled_loss(var * 3.0)
        grads = opt.get_unscaled_gradients(tape.gradient(loss, [var]))
        opt.apply_gradients(zip(grads, [var]))
        result = float(var.numpy())
        """,
    "Policy": """\
        result = {name}('mixed_float16').compute_dtype
        """,
    "set_policy": """\
        {name}('mixed_bfloat16')
        result = tf.keras.mixed_precision.global_policy().name
        tf.keras.mixed_precision.set_global_policy('float32')
        """,
    "global_policy": """\
        result = {name}().name
        """,
    "enable_mixed_precision_graph_rewrite": """\
        opt = {name}(tf.keras.optimizers.SGD(0.1))
        var = tf.Variable(1.0)
        opt.apply_gradients([(tf.constant(1.0), var)])
        result = float(var.numpy())
        tf.config.optimizer.set_experimental_options({{'auto_mixed_precision': False}})
        """,
    "disable_mixed_precision_graph_rewrite": """\
        tf.config.optimizer.set_experimental_options({{'auto_mixed_precision': True}})
        {name}()
        result = tf.config.optimizer.get_experimental_options().get('auto_mixed_precision')
        """,
}


def _program(name):
    for key in sorted(PROGRAMS, key=len, reverse=True):
        if name.endswith("." + key):
            spelling = "tf." + name[len("tensorflow."):]
            return "import tensorflow as tf\n" + textwrap.dedent(
                PROGRAMS[key]).format(name=spelling)
    raise AssertionError(f"no program for {name}")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("name", sorted(legacy_names.LEGACY_NAMES))
def test_each_legacy_spelling_converts_safely_or_is_named(name):
    source = _program(name)
    new, notes = migrate.rewrite(source)
    if notes:  # Then every note names a line of the program.
        assert all(1 <= n.line <= len(source.splitlines()) for n in notes)
        return
    legacy_module = name.rsplit(".", 1)[0].replace("tensorflow.", "tf.", 1)
    assert legacy_module + "." not in new.replace(
        "tf.compat.v1.train.GradientDescentOptimizer", ""), new
    assert migrate.rewrite(new) == (new, [])
    assert result_of(new, shim=False) == result_of(source, shim=True)
