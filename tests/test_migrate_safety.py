"""`migrate` is never silently wrong (issue 19): what it writes computes what
the original computes under the shim, or it exits 1 naming the line.

Each test runs a small legacy program under the shim and its migrated text
without it, in this process (Keras 3), and compares the numbers; or checks
that the line is named.
"""

import io
import contextlib
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import tf_lossscale.compat
from tf_lossscale.compat import migrate


def _run(source, shim):
    """Executes `source`; returns its globals."""
    namespace = {"__name__": "__legacy__"}
    if shim:
        tf_lossscale.compat.install()
    try:
        exec(compile(source, "<legacy>", "exec"), namespace)
    finally:
        if shim:
            tf_lossscale.compat.uninstall()
    return namespace


def _migrated(source):
    new, notes = migrate.rewrite(textwrap.dedent(source))
    assert notes == [], notes
    return new


def _both(source, name="var"):
    """(value under the shim, value after migrate) of global `name`."""
    source = textwrap.dedent(source)
    return (np.asarray(_run(source, shim=True)[name]),
            np.asarray(_run(_migrated(source), shim=False)[name]))


# Item 1: the experimental optimizer applied unscaled gradients.

ISSUE_SMALLEST_CASE = """\
    import tensorflow as tf
    opt = tf.keras.mixed_precision.experimental.LossScaleOptimizer(tf.keras.optimizers.SGD(0.1), 'dynamic')
    var = tf.Variable(1.0)
    opt.apply_gradients([(tf.constant(1.0), var)])
    var = var.numpy()
    """


def test_experimental_optimizer_applied_unscaled_keeps_its_semantics():
    shim, migrated = _both(ISSUE_SMALLEST_CASE)
    assert shim == pytest.approx(0.9)
    assert migrated == pytest.approx(0.9)


def test_graph_rewrite_of_a_keras_optimizer_applied_unscaled_keeps_it():
    shim, migrated = _both("""\
        import tensorflow as tf
        opt = tf.train.experimental.enable_mixed_precision_graph_rewrite(
            tf.keras.optimizers.SGD(0.1))
        var = tf.Variable(1.0)
        opt.apply_gradients([(tf.constant(1.0), var)])
        var = var.numpy()
        tf.config.optimizer.set_experimental_options(
            {'auto_mixed_precision': False})
        """)
    assert shim == pytest.approx(0.9)
    assert migrated == pytest.approx(0.9)


def test_experimental_optimizer_that_scales_becomes_the_current_class():
    source = """\
        import tensorflow as tf
        opt = tf.keras.mixed_precision.experimental.LossScaleOptimizer(
            tf.keras.optimizers.SGD(0.1), 'dynamic')
        var = tf.Variable(1.0)
        with tf.GradientTape() as tape:
            loss = opt.get_scaled_loss(var * 2.0)
        grads = opt.get_unscaled_gradients(tape.gradient(loss, [var]))
        opt.apply_gradients(zip(grads, [var]))
        var = var.numpy()
        """
    assert "tf_lossscale.LossScaleOptimizer(" in _migrated(
        textwrap.dedent(source))
    shim, migrated = _both(source)
    assert shim == migrated == pytest.approx(0.8)
