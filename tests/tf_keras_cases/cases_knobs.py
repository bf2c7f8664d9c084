"""The scaling-policy knobs (docs/scaling-policy.md) on the tf_keras flavour.

Runs under TF_USE_LEGACY_KERAS=1 (see tests/_tf_keras_cases.py). The tests
that hold on both Kerases are written once, in tests/_both_knobs.py, and run
here on tf_keras (imported below; the `flavour` fixture is tf_keras' in this
process): each step against the plain-Python model, eagerly, in `tf.function`
and under MirroredStrategy, with every skipped step leaving the variable and
the slots bit for bit as they were; bad values; the config. Here, what only
tf_keras has: checkpoints that interchange with tf_keras' own optimizer.
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

import numpy as np
import pytest
import tensorflow as tf
import tf_keras
from _both_knobs import *  # noqa: F403 (the tests on both Kerases)
from _both_knobs import DEFAULT_KNOBS, checkpoint_keys, make

import tf_lossscale

OURS = tf_lossscale.LossScaleOptimizer
THEIRS = tf_keras.mixed_precision.LossScaleOptimizer


def test_the_flavour_is_tf_keras(flavour):
    assert flavour.name == "tf_keras"
    assert type(make(flavour)).__name__ == "TfKerasLossScaleOptimizer"


def _trained(make: Any, **knobs: Any) -> Tuple[Any, Any]:
    """A variable and an optimizer after a finite step and a NaN step."""
    var = tf.Variable([1.0, 2.0])
    opt = make(tf_keras.optimizers.SGD(0.125, momentum=0.5),
               initial_scale=8.0, dynamic_growth_steps=2, **knobs)
    for grad in ([1.0, 1.0], [np.nan, 1.0]):
        (unscaled,) = opt.get_unscaled_gradients(
            [tf.constant(grad) * opt.loss_scale])
        opt.apply_gradients([(unscaled, var)])
    return var, opt


def _fresh(make: Any, **knobs: Any) -> Tuple[Any, Any]:
    var = tf.Variable([0.0, 0.0])
    opt = make(tf_keras.optimizers.SGD(0.125, momentum=0.5),
               initial_scale=8.0, dynamic_growth_steps=2, **knobs)
    opt.build([var])
    return var, opt


def _state(var: Any, opt: Any) -> Tuple[Any, ...]:
    return ([v.numpy().tolist() for v in opt.inner_optimizer.variables],
            var.numpy().tolist(), float(opt.loss_scale),
            int(opt.dynamic_counter))


def _write(var: Any, opt: Any, path: Any) -> str:
    return tf.train.Checkpoint(var=var, optimizer=opt).write(str(path))


@pytest.mark.parametrize("writer, reader", [(OURS, THEIRS), (THEIRS, OURS)],
                         ids=["ours_to_tf_keras", "tf_keras_to_ours"])
def test_default_knob_checkpoints_interchange_with_tf_keras_own(
        tmp_path, writer, reader):
    def make(inner: Any, **kwargs: Any) -> Any:
        knobs: Dict[str, Any] = DEFAULT_KNOBS if writer is OURS else {}
        return writer(inner, **kwargs, **knobs)

    var, opt = _trained(make)
    assert float(opt.loss_scale) == 4.0
    path = _write(var, opt, tmp_path / "ckpt")
    new_var, new_opt = _fresh(reader)
    tf.train.Checkpoint(var=new_var, optimizer=new_opt).read(
        path).assert_consumed()
    assert _state(new_var, new_opt) == _state(var, opt)


def test_default_knob_checkpoints_hold_tf_keras_own_keys(tmp_path):
    ours = _write(*_trained(OURS, **DEFAULT_KNOBS), tmp_path / "ours")
    theirs = _write(*_trained(THEIRS), tmp_path / "theirs")
    # Neither `skipped_steps` nor a hysteresis count.
    assert checkpoint_keys(ours) == checkpoint_keys(theirs)


