"""Under the shim, the experimental optimizer's `loss_scale` (and that of the
optimizer the graph rewrite returns) is both TF 2.1-2.3's `LossScale` object
and the number TF 2.4 code used it as (issue 19, item 4)."""

import numpy as np
import pytest
import tensorflow as tf

from tf_lossscale import compat


@pytest.fixture
def shim():
    compat.install()
    try:
        yield
    finally:
        compat.uninstall()


def _optimizers():
    """(experimental optimizer, the graph rewrite's), dynamic at 2**15."""
    exp = tf.keras.mixed_precision.experimental.LossScaleOptimizer(
        tf.keras.optimizers.SGD(0.1), "dynamic")
    rewritten = tf.train.experimental.enable_mixed_precision_graph_rewrite(
        tf.keras.optimizers.SGD(0.1))
    tf.train.experimental.disable_mixed_precision_graph_rewrite()
    return exp, rewritten


@pytest.mark.parametrize("which", [0, 1], ids=["experimental",
                                               "graph_rewrite"])
def test_loss_scale_is_a_number_eagerly(shim, which, recwarn):
    view = _optimizers()[which].loss_scale
    assert float(view) == 32768.0
    assert int(view) == 32768
    assert "Loss scale %g" % view == "Loss scale 32768"
    assert "%.1f" % view == "32768.0"
    assert f"{view:g}" == "32768" and f"{view:.2f}" == "32768.00"
    assert "{:>8.0f}".format(view) == "   32768"
    assert float(view * 2) == 65536.0 and float(2 * view) == 65536.0
    assert float(view + 1) == 32769.0 and float(1 + view) == 32769.0
    assert float(view - 1) == 32767.0 and float(32769 - view) == 1.0
    assert float(view / 2) == 16384.0 and float(65536 / view) == 2.0
    assert float(-view) == -32768.0 and float(view ** 1) == 32768.0
    assert view > 1 and view >= 32768 and view < 1e9 and view <= 32768
    assert view == 32768.0 and view != 1.0
    assert view.numpy() == np.float32(32768.0)
    assert np.asarray(view) == 32768.0 and np.log2(view) == 15.0
    assert view.dtype == tf.float32
    tensor = tf.convert_to_tensor(view)
    assert tensor.dtype == tf.float32 and float(tensor) == 32768.0
    assert float(tf.cast(view, tf.float16)) == 32768.0
    assert float(tf.math.log(view) / tf.math.log(2.0)) == pytest.approx(15)
    assert float(tf.maximum(view, 1.0)) == 32768.0
    # And TF 2.1-2.3's LossScale object, as before.
    assert float(view()) == 32768.0
    assert view.get_config()["initial_loss_scale"] == 32768.0
    assert repr(view).startswith("DynamicLossScale(current_loss_scale=32768")
    assert str(view) == repr(view) and f"{view}" == repr(view)


def test_loss_scale_is_a_number_in_tf_function(shim, recwarn):
    opt = _optimizers()[0]
    writer = tf.summary.create_noop_writer()

    @tf.function
    def step():
        view = opt.loss_scale
        with writer.as_default():
            tf.summary.scalar("loss_scale", view, step=0)
        return (view * 2, 2 * view, view + 1.0, view / 4, tf.cast(view,
                tf.float16), tf.convert_to_tensor(view), view(),
                view > 1.0, tf.math.log(view))

    results = [float(r) for r in step()]
    assert results[:7] == [65536.0, 65536.0, 32769.0, 8192.0, 32768.0,
                           32768.0, 32768.0]
    assert results[7] == 1.0
    assert results[8] == pytest.approx(np.log(32768.0))


def test_loss_scale_of_a_fixed_optimizer_is_its_number(shim, recwarn):
    opt = tf.keras.mixed_precision.experimental.LossScaleOptimizer(
        tf.keras.optimizers.SGD(0.1), 128)
    assert "%g" % opt.loss_scale == "128"
    assert repr(opt.loss_scale) == "FixedLossScale(128.0)"
    tf.summary.scalar("s", opt.loss_scale, step=0)  # No default writer: noop.
