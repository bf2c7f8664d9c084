"""Loss-scaling state belongs to one optimizer, and to one TF1 graph.

Two models with two `LossScaleOptimizer`s in one process share no
variable and no Python-side state: what happens to one (skipped steps,
`get_unscaled_gradients`) leaves the other exactly as if it ran alone. One
`DynamicLossScale` used in two TF1 graphs keeps a separate scale and
counter per graph (and eagerly).
"""

import keras
import numpy as np
import tensorflow as tf
from _model import trajectory

import tf_lossscale

NAN = float("nan")


def _model_and_optimizer(seed):
    model = keras.Sequential([
        keras.Input((3,)),
        keras.layers.Dense(2, kernel_initializer=keras.initializers.
                           GlorotUniform(seed=seed)),
        keras.layers.Dense(1, kernel_initializer="ones"),
    ])
    opt = tf_lossscale.LossScaleOptimizer(
        keras.optimizers.Adam(0.01), initial_scale=2.0**8,
        dynamic_growth_steps=2)
    opt.build(model.trainable_variables)
    return model, opt


def _batch(step, poison=False):
    rng = np.random.default_rng(step)
    x = rng.normal(size=(4, 3)).astype("float32")
    if poison:
        x[0, 0] = NAN
    return x, x.sum(axis=1, keepdims=True)


def _train_step(model, opt, x, y):
    """Keras 3's own flow: scale_loss, then the scaled gradients."""
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x) - y))
        scaled = opt.scale_loss(loss)
    grads = tape.gradient(scaled, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))


def _state(model, opt):
    return ([w.tobytes() for w in model.get_weights()],
            [np.asarray(v).tobytes() for v in opt.variables])


POISONED = {1, 2, 5}  # steps with a NaN for model A only
STEPS = 8


def _run_b_alone():
    model, opt = _model_and_optimizer(seed=2)
    for step in range(STEPS):
        _train_step(model, opt, *_batch(100 + step))
    return _state(model, opt)


def test_two_optimizers_share_no_variable():
    model_a, opt_a = _model_and_optimizer(seed=1)
    model_b, opt_b = _model_and_optimizer(seed=2)
    ids_a = {id(v) for v in opt_a.variables}
    ids_b = {id(v) for v in opt_b.variables}
    assert not ids_a & ids_b
    assert len(ids_a) == len(ids_b) == len(opt_a.variables)


def test_skips_of_one_model_leave_the_other_as_if_alone():
    model_a, opt_a = _model_and_optimizer(seed=1)
    model_b, opt_b = _model_and_optimizer(seed=2)
    for step in range(STEPS):
        _train_step(model_a, opt_a, *_batch(step, step in POISONED))
        _train_step(model_b, opt_b, *_batch(100 + step))
    flags = [step not in POISONED for step in range(STEPS)]
    expected_a = trajectory(flags, initial=2.0**8, period=2, multiplier=2)
    expected_b = trajectory([True] * STEPS, initial=2.0**8, period=2,
                            multiplier=2)
    assert (float(opt_a.loss_scale), int(opt_a.dynamic_counter)) == \
        expected_a[-1]
    assert (float(opt_b.loss_scale), int(opt_b.dynamic_counter)) == \
        expected_b[-1]
    assert int(opt_a.iterations) == int(opt_b.iterations) == STEPS
    assert _state(model_b, opt_b) == _run_b_alone()


def test_unscaling_on_one_optimizer_does_not_mark_the_other():
    """`get_unscaled_gradients` on A says nothing about B's next step: B
    still takes its gradients as scaled and unscales them."""
    model_a, opt_a = _model_and_optimizer(seed=1)
    model_b, opt_b = _model_and_optimizer(seed=2)
    x, y = _batch(7)
    with tf.GradientTape() as tape:
        scaled_a = opt_a.scale_loss(tf.reduce_mean(
            tf.square(model_a(x) - y)))
    opt_a.get_unscaled_gradients(
        tape.gradient(scaled_a, model_a.trainable_variables))
    _train_step(model_b, opt_b, *_batch(100))

    lone_model, lone_opt = _model_and_optimizer(seed=2)
    _train_step(lone_model, lone_opt, *_batch(100))
    assert _state(model_b, opt_b) == _state(lone_model, lone_opt)


def test_two_optimizers_in_one_traced_step_keep_their_own_state():
    model_a, opt_a = _model_and_optimizer(seed=1)
    model_b, opt_b = _model_and_optimizer(seed=2)

    @tf.function
    def step(xa, ya, xb, yb):
        _train_step(model_a, opt_a, xa, ya)
        _train_step(model_b, opt_b, xb, yb)

    for i in range(STEPS):
        step(*_batch(i, i in POISONED), *_batch(100 + i))
    assert float(opt_a.loss_scale) != float(opt_b.loss_scale)
    assert _state(model_b, opt_b) == _run_b_alone()


# One DynamicLossScale, two TF1 graphs.

V1 = tf.compat.v1


def _tf1_training(loss_scale, name):
    """A graph training one variable with `loss_scale`; the fed `grad` is
    the gradient of its loss."""
    graph = tf.Graph()
    with graph.as_default():
        var = V1.get_variable(name, initializer=[1.0, 2.0],
                              use_resource=True)
        grad = V1.placeholder(tf.float32, [2])
        opt = tf_lossscale.MixedPrecisionLossScaleOptimizer(
            V1.train.GradientDescentOptimizer(0.1), loss_scale)
        train_op = opt.minimize(tf.reduce_sum(grad * var), var_list=[var])
        fetch = (loss_scale(), loss_scale.good_steps)
        init = V1.global_variables_initializer()
    session = V1.Session(graph=graph)
    session.run(init)
    return graph, session, grad, train_op, fetch


def test_one_loss_scale_keeps_separate_variables_per_tf1_graph():
    loss_scale = tf_lossscale.DynamicLossScale(
        initial_loss_scale=16.0, increment_period=2, multiplier=2.0)
    first = _tf1_training(loss_scale, "w1")
    second = _tf1_training(loss_scale, "w2")
    # Interleaved: the first graph sees NaNs, the second only finite steps.
    sessions = (first, second)
    feeds = {0: ([NAN, 1.0], [NAN, 1.0], [1.0, 1.0]),
             1: ([1.0, 1.0], [1.0, 1.0], [1.0, 1.0])}
    for step in range(3):
        for index, (_, session, grad, train_op, _) in enumerate(sessions):
            session.run(train_op, {grad: feeds[index][step]})
    assert first[1].run(first[4]) == (4.0, 1)     # 16 -> 8 -> 4, one good
    assert second[1].run(second[4]) == (32.0, 1)  # 16 -> 32 after 2 good
    # Each graph holds its own pair of variables; eagerly there is a third.
    graph_vars = [
        {v.name for v in g.get_collection(V1.GraphKeys.GLOBAL_VARIABLES)}
        for g, *_ in sessions]
    for names in graph_vars:
        assert {"current_loss_scale:0", "good_steps:0"} <= names
    assert float(loss_scale()) == 16.0
    assert int(loss_scale.good_steps) == 0
    for _, session, *_ in sessions:
        session.close()
