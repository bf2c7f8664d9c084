"""Model Garden's own `ExponentialMovingAverage` optimizer, wrapped by ours.

Model Garden (`tf-models-official` 2.20.0 on PyPI, TF 2.20's) averages the
weights with an OptimizerV2 of tf_keras' legacy family that wraps another
one; its `apply_gradients(grads_and_vars, name)` takes no
`experimental_aggregate_gradients`, so tf_keras' own `LossScaleOptimizer`
fails on it with a `TypeError`. Ours hands it the gradients unsummed and
lets it sum them, as it does alone: weights, averages and `iterations`
come out exactly as the EMA optimizer's own run without loss scaling (a
skipped step only advances `iterations`, as TensorFlow's wrapper did), on
one device and on two replicas, where a NaN on one replica makes both skip.

The file runs as Model Garden ships it, loaded from the wheel at test time
(`tests/_pypi_wheels.py`: cached, never committed; it imports only
TensorFlow and tf_keras).
"""

import importlib.util

import numpy as np
import pytest
import tensorflow as tf
from _pypi_wheels import python_files, wheel

import tf_lossscale

tf_keras = pytest.importorskip("tf_keras")

pytestmark = pytest.mark.slow  # A download on a fresh machine.

VERSION = "2.20.0"
EMA_FILE = "official/modeling/optimization/ema_optimizer.py"
NAN = float("nan")


@pytest.fixture(scope="module")
def ema_class(tmp_path_factory):
    folder = tmp_path_factory.mktemp("model_garden")
    assert python_files(wheel("tf-models-official", VERSION), folder,
                        EMA_FILE) == 1
    spec = importlib.util.spec_from_file_location(
        "_model_garden_ema_optimizer", folder / EMA_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ExponentialMovingAverage


def _model_and_ema(ema_class):
    """A one-Dense tf_keras model (kernel of ones) and Model Garden's EMA
    optimizer over SGD(0.5), its averages made (`shadow_copy`)."""
    model = tf_keras.Sequential([tf_keras.layers.Dense(
        2, use_bias=False, kernel_initializer="ones", input_shape=(1,))])
    ema = ema_class(tf_keras.optimizers.legacy.SGD(0.5))
    ema.shadow_copy(model)
    return model.trainable_variables[0], ema


def _state(kernel, ema):
    return (kernel.numpy().tolist(),
            ema.get_slot(kernel, "average").numpy().tolist(),
            int(ema.iterations))


STEPS = [[[1.0, 1.0]], [[NAN, 1.0]], [[0.5, -0.5]]]


def test_tf_keras_own_wrapper_cannot_apply_it(ema_class):
    kernel, ema = _model_and_ema(ema_class)
    theirs = tf_keras.mixed_precision.LossScaleOptimizer(ema)
    with pytest.raises(TypeError, match="experimental_aggregate_gradients"):
        theirs.apply_gradients([(tf.constant(STEPS[0]), kernel)])


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_ours_trains_it_as_it_trains_alone(ema_class, traced):
    kernel, ema = _model_and_ema(ema_class)
    opt = tf_lossscale.LossScaleOptimizer(ema, initial_scale=2.0**10)

    def step(grad):
        opt.apply_gradients([(grad, kernel)])

    run = tf.function(step) if traced else step
    states = []
    for grad in STEPS:
        run(tf.constant(grad))
        states.append(_state(kernel, ema))

    alone, alone_ema = _model_and_ema(ema_class)
    expected = []
    for grad in STEPS:
        if np.isfinite(grad).all():
            alone_ema.apply_gradients([(tf.constant(grad), alone)])
        else:  # What a skipped step does: only `iterations` advances.
            alone_ema.iterations.assign_add(1)
        expected.append(_state(alone, alone_ema))
    assert states == expected
    assert states[1][:2] == states[0][:2]  # The NaN step changed nothing.
    assert expected[-1][0] == [[0.25, 0.75]]
    assert float(opt.loss_scale) == 2.0**9


def test_two_replicas_sum_once_and_skip_together(ema_class,
                                                 mirrored_strategy):
    strategy = mirrored_strategy

    def replica_grads(values):
        """Replica r's gradient: values[r]."""
        def fn(context):
            return tf.constant(values)[context.replica_id_in_sync_group]
        return strategy.experimental_distribute_values_from_function(fn)

    def run(wrap):
        with strategy.scope():
            kernel, ema = _model_and_ema(ema_class)
            opt = wrap(ema)

        @tf.function
        def step(grads):
            strategy.run(lambda g: opt.apply_gradients([(g, kernel)]),
                         args=(grads,))

        states = []
        for values in ([[[1.0, 1.0]], [[0.5, 0.0]]],
                       [[[1.0, 1.0]], [[NAN, 0.0]]]):
            step(replica_grads(values))
            average = ema.get_slot(kernel, "average")
            states.append([
                (k.numpy().tolist(), a.numpy().tolist(), int(i))
                for k, a, i in zip(kernel.values, average.values,
                                   ema.iterations.values)])
        return states, opt

    ours, opt = run(lambda ema: tf_lossscale.LossScaleOptimizer(ema))
    alone, _ = run(lambda ema: ema)
    # The first step: summed once (1 + 0.5, 1 + 0), as the EMA optimizer
    # alone sums, on both replicas.
    assert ours[0] == alone[0]
    assert ours[0][0][0] == [[0.25, 0.5]] and ours[0][1][0] == [[0.25, 0.5]]
    # The second: a NaN on replica 1 only; both replicas skip.
    assert [s[:2] for s in ours[1]] == [s[:2] for s in ours[0]]
    assert [s[2] for s in ours[1]] == [2, 2]
    assert float(opt.loss_scale) == 2.0**14
