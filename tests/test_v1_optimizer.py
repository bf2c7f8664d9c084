"""tf_lossscale.MixedPrecisionLossScaleOptimizer in TF1 graph mode.

Every test builds its own `tf.compat.v1.Graph` and runs it in a `Session`.
Finite and non-finite steps are made by feeding a placeholder, so one graph
serves a whole trajectory.
"""

import pathlib
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_lossscale
from tf_lossscale import MixedPrecisionLossScaleOptimizer

v1 = tf.compat.v1
README = pathlib.Path(__file__).resolve().parents[1] / "docs" / "custom-loops.md"


def _variable(name, value, dtype=tf.float32):
    return v1.get_variable(
        name, initializer=tf.constant(value, dtype), use_resource=True)


def _bits(values):
    """Raw bytes of each value: equality means bit-identical (NaN included)."""
    return [np.asarray(v).tobytes() for v in values]


def _no_rewrite_config():
    """A session config that keeps float16 arithmetic in graph order."""
    config = v1.ConfigProto()
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    config.graph_options.optimizer_options.opt_level = v1.OptimizerOptions.L0
    return config


# Dynamic scale 4, period 2, multiplier 2: the finite flags of each step and
# the scale after it, written out by hand from the documented rule.
FINITE = [True, True, False, True, False, False, False, True, True, True]
SCALES = [4.0, 8.0, 4.0, 4.0, 2.0, 1.0, 1.0, 1.0, 2.0, 2.0]
FINITE_FEEDS = [[0.5, -1.25, 2.0], [1.0, 0.25, -0.75], [-2.0, 0.5, 1.5]]
NON_FINITE_FEEDS = [[np.nan, 1.0, 1.0], [1.0, np.inf, 1.0],
                    [1.0, 1.0, -np.inf]]


def _feeds():
    finite = iter(FINITE_FEEDS * 3)
    bad = iter(NON_FINITE_FEEDS * 2)
    return [next(finite) if ok else next(bad) for ok in FINITE]


def test_trajectory_skips_non_finite_steps_and_matches_plain_optimizer():
    with tf.Graph().as_default():
        w = _variable("w", [1.0, -1.0, 0.5])
        w_ref = _variable("w_ref", [1.0, -1.0, 0.5])
        x = v1.placeholder(tf.float32, [3])
        inner = v1.train.MomentumOptimizer(0.125, 0.5)
        opt = MixedPrecisionLossScaleOptimizer(
            inner, tf_lossscale.DynamicLossScale(4, 2, 2.0))
        train_op = opt.minimize(tf.reduce_sum(w * x), var_list=[w])
        ref = v1.train.MomentumOptimizer(0.125, 0.5)
        ref_op = ref.apply_gradients([(x, w_ref)])
        state = [w, inner.get_slot(w, "momentum")]
        ref_state = [w_ref, ref.get_slot(w_ref, "momentum")]
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            scales = []
            for feed, ok in zip(_feeds(), FINITE):
                before = sess.run(state)
                sess.run(train_op, {x: feed})
                scales.append(float(sess.run(opt.loss_scale())))
                if ok:
                    sess.run(ref_op, {x: feed})
                    assert _bits(sess.run(state)) == _bits(
                        sess.run(ref_state))
                else:
                    assert _bits(sess.run(state)) == _bits(before)
    assert scales == SCALES


@pytest.mark.parametrize("make_inner", [
    pytest.param(lambda: v1.train.MomentumOptimizer(0.1, 0.9), id="momentum"),
    pytest.param(lambda: v1.train.AdamOptimizer(0.1), id="adam"),
])
def test_skipped_step_leaves_every_optimizer_variable_bit_identical(
        make_inner):
    with tf.Graph().as_default():
        w = _variable("w", [1.0, 2.0])
        x = v1.placeholder(tf.float32, [2])
        opt = MixedPrecisionLossScaleOptimizer(make_inner(), "dynamic")
        train_op = opt.minimize(tf.reduce_sum(w * x))
        tracked = [w] + opt.inner_optimizer.variables()
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(train_op, {x: [1.0, -0.5]})
            before = sess.run(tracked)
            sess.run(train_op, {x: [np.nan, -0.5]})
            after = sess.run(tracked)
            scale = sess.run(opt.loss_scale())
    assert len(tracked) >= 2  # the slots (and Adam's powers) exist
    assert _bits(after) == _bits(before)
    assert scale == 2.0**14


def test_global_step_counts_applied_steps_only():
    with tf.Graph().as_default():
        w = _variable("w", 1.0)
        x = v1.placeholder(tf.float32, [])
        step = v1.train.get_or_create_global_step()
        opt = MixedPrecisionLossScaleOptimizer(
            v1.train.GradientDescentOptimizer(0.5), "dynamic")
        train_op = opt.minimize(w * x, global_step=step)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            steps = []
            for feed in [1.0, np.nan, 2.0, np.inf, np.inf, 1.0]:
                sess.run(train_op, {x: feed})
                steps.append(int(sess.run(step)))
    assert steps == [1, 1, 2, 2, 2, 3]


def test_matches_tensorflows_own_optimizer_step_for_step():
    feeds = [1.0, 0.5, np.inf, -1.0, 2.0, np.nan, 0.25]
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float32, [])
        runs = []
        for cls, scale in [
                (MixedPrecisionLossScaleOptimizer,
                 tf_lossscale.DynamicLossScale(8, 2)),
                (v1.mixed_precision.MixedPrecisionLossScaleOptimizer,
                 v1.mixed_precision.DynamicLossScale(8, 2))]:
            w = _variable(f"w_{len(runs)}", 1.0)
            step = v1.Variable(0, dtype=tf.int64, name=f"step_{len(runs)}")
            opt = cls(v1.train.MomentumOptimizer(0.25, 0.5), scale)
            train_op = opt.minimize(w * x, global_step=step)
            runs.append((train_op, [w, step, scale()]))
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for feed in feeds:
                for train_op, _ in runs:
                    sess.run(train_op, {x: feed})
                ours, theirs = (sess.run(state) for _, state in runs)
                assert _bits(ours) == _bits(theirs)
    assert [float(ours[0]), int(ours[1]), float(ours[2])] == [
        float(theirs[0]), 5, 8.0]


@pytest.mark.parametrize("loss_scale, cls, config", [
    ("dynamic", tf_lossscale.DynamicLossScale,
     {"initial_loss_scale": 32768.0, "increment_period": 2000,
      "multiplier": 2.0}),
    (128, tf_lossscale.FixedLossScale, {"loss_scale_value": 128.0}),
    (0.5e3, tf_lossscale.FixedLossScale, {"loss_scale_value": 500.0}),
], ids=["dynamic", "int", "float"])
def test_loss_scale_identifier_is_resolved(loss_scale, cls, config):
    with tf.Graph().as_default():
        opt = MixedPrecisionLossScaleOptimizer(
            v1.train.GradientDescentOptimizer(1.0), loss_scale)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            value = sess.run(opt.loss_scale())
    assert type(opt.loss_scale) is cls
    assert opt.loss_scale.get_config() == config
    assert value == next(iter(config.values()))


# Float16 gradient chain: d/dw of ((w * a) * b) * c is computed as
# ((1 * c) * b) * a; with c = 2**-12 and b = 2**-13 the middle product
# 2**-25 underflows to 0 in float16, though the answer 2**-13 is representable.
FP16_FEED = {"a": 2.0**12, "b": 2.0**-13, "c": 2.0**-12}


def _fp16_chain():
    w = _variable("w", 0.0, tf.float16)
    a, b, c = (v1.placeholder(tf.float16, [], name=n) for n in "abc")
    feed = {a: FP16_FEED["a"], b: FP16_FEED["b"], c: FP16_FEED["c"]}
    return w, lambda: ((w * a) * b) * c, feed


def test_float16_chain_underflows_without_loss_scaling():
    with tf.Graph().as_default():
        w, loss_fn, feed = _fp16_chain()
        ((grad, _),) = v1.train.GradientDescentOptimizer(1.0).compute_gradients(
            loss_fn(), var_list=[w])
        with v1.Session(config=_no_rewrite_config()) as sess:
            sess.run(v1.global_variables_initializer())
            assert sess.run(grad, feed) == 0.0


@pytest.mark.parametrize("loss_scale", [
    "dynamic", 1024, tf_lossscale.FixedLossScale(1024),
    tf_lossscale.DynamicLossScale(initial_loss_scale=1024),
], ids=["dynamic", "number", "FixedLossScale", "DynamicLossScale"])
def test_float16_variable_gets_exact_gradient_and_update(loss_scale):
    with tf.Graph().as_default():
        w, loss_fn, feed = _fp16_chain()
        opt = MixedPrecisionLossScaleOptimizer(
            v1.train.GradientDescentOptimizer(1.0), loss_scale)
        grads_and_vars = opt.compute_gradients(loss_fn(), var_list=[w])
        train_op = opt.apply_gradients(grads_and_vars)
        ((grad, _),) = grads_and_vars
        with v1.Session(config=_no_rewrite_config()) as sess:
            sess.run(v1.global_variables_initializer())
            grad_value = sess.run(grad, feed)
            sess.run(train_op, feed)
            w_value = sess.run(w)
    assert grad.dtype == tf.float16 and w.dtype.base_dtype == tf.float16
    assert grad_value == np.float16(2.0**-13)
    assert w_value == np.float16(-(2.0**-13))


def test_callable_loss_is_scaled():
    with tf.Graph().as_default():
        w, loss_fn, feed = _fp16_chain()
        opt = MixedPrecisionLossScaleOptimizer(
            v1.train.GradientDescentOptimizer(1.0), "dynamic")
        ((grad, _),) = opt.compute_gradients(loss_fn, var_list=[w])
        with v1.Session(config=_no_rewrite_config()) as sess:
            sess.run(v1.global_variables_initializer())
            assert sess.run(grad, feed) == np.float16(2.0**-13)


def test_embedding_gradients_stay_sparse_and_skip_on_nan():
    with tf.Graph().as_default():
        table = _variable("table", np.arange(8, dtype=np.float32).reshape(4, 2))
        ids = v1.placeholder(tf.int32, [2])
        x = v1.placeholder(tf.float32, [2, 2])
        loss = tf.reduce_sum(tf.nn.embedding_lookup(table, ids) * x)
        inner = v1.train.MomentumOptimizer(1.0, 0.5)
        opt = MixedPrecisionLossScaleOptimizer(inner, "dynamic")
        grads_and_vars = opt.compute_gradients(loss, var_list=[table])
        ((grad, _),) = grads_and_vars
        train_op = opt.apply_gradients(grads_and_vars)
        momentum = inner.get_slot(table, "momentum")
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            feed = {ids: [3, 1], x: [[0.5, -1.0], [2.0, 0.25]]}
            values, indices = sess.run([grad.values, grad.indices], feed)
            sess.run(train_op, feed)
            applied = sess.run([table, momentum])
            sess.run(train_op, {ids: [0, 2], x: [[np.nan, 1.0], [1.0, 1.0]]})
            skipped = sess.run([table, momentum])
    assert isinstance(grad, tf.IndexedSlices)
    np.testing.assert_array_equal(values, [[0.5, -1.0], [2.0, 0.25]])
    np.testing.assert_array_equal(indices, [3, 1])
    np.testing.assert_array_equal(
        applied[0], [[0, 1], [0.0, 2.75], [4, 5], [5.5, 8.0]])
    assert _bits(skipped) == _bits(applied)


def test_fixed_loss_scale_skips_a_non_finite_step():
    # A deliberate difference: TensorFlow's class applies it (w becomes -inf).
    with tf.Graph().as_default():
        w = _variable("w", 1.0)
        x = v1.placeholder(tf.float32, [])
        step = v1.train.get_or_create_global_step()
        opt = MixedPrecisionLossScaleOptimizer(
            v1.train.GradientDescentOptimizer(1.0), 64)
        train_op = opt.minimize(w * x, global_step=step)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(train_op, {x: 0.5})
            assert sess.run([w, step]) == [0.5, 1]
            sess.run(train_op, {x: np.inf})
            w_value, step_value = sess.run([w, step])
            sess.run(train_op, {x: 0.5})
            after = sess.run([w, step])
    # Skipped: w and global_step (which counts applied steps) stay.
    assert (w_value, step_value) == (0.5, 1)
    assert after == [0.0, 2]


def test_slots_and_variables_come_from_the_inner_optimizer():
    with tf.Graph().as_default():
        w = _variable("w", [1.0, 2.0])
        inner = v1.train.MomentumOptimizer(0.5, 0.9)
        opt = MixedPrecisionLossScaleOptimizer(inner, "dynamic")
        train_op = opt.minimize(tf.reduce_sum(w * w))
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(train_op)
            w_value = sess.run(w)
        names = sorted(v.name for v in opt.variables())
    # As TensorFlow's wrapper: the slots are the inner optimizer's only.
    assert opt.get_slot_names() == [] and inner.get_slot_names() == [
        "momentum"]
    assert opt.get_slot(w, "momentum") is None
    assert names == ["current_loss_scale:0", "good_steps:0", "w/Momentum:0"]
    np.testing.assert_array_equal(w_value, [0.0, 0.0])
    assert isinstance(opt, v1.train.Optimizer)
    assert isinstance(train_op, tf.Operation)


@pytest.mark.parametrize("nan_replica", [0, 1])
def test_nan_on_one_replica_makes_every_replica_skip(
        mirrored_strategy, nan_replica):
    strategy = mirrored_strategy
    with tf.Graph().as_default(), strategy.scope():
        w = _variable("w", [1.0, -1.0])
        x = v1.placeholder(tf.float32, [2, 2])
        step = v1.train.get_or_create_global_step()
        inner = v1.train.MomentumOptimizer(0.5, 0.5)
        opt = MixedPrecisionLossScaleOptimizer(inner, "dynamic")

        def replica_step():
            context = tf.distribute.get_replica_context()
            loss = tf.reduce_sum(w * x[context.replica_id_in_sync_group])
            return opt.minimize(loss, global_step=step)

        train_op = strategy.group(
            strategy.extended.call_for_each_replica(replica_step))
        momentum = inner.get_slot(w, "momentum")
        copies = list(w.values) + list(momentum.values) + list(step.values)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(train_op, {x: [[0.5, 1.0], [1.5, -2.0]]})
            applied = sess.run(copies)
            bad = np.ones([2, 2], np.float32)
            bad[nan_replica, 1] = np.nan
            sess.run(train_op, {x: bad})
            skipped = sess.run(copies)
            scale = sess.run(opt.loss_scale())
    np.testing.assert_array_equal(applied[0], [0.0, -0.5])  # w - 0.5 * sum
    np.testing.assert_array_equal(applied[1], applied[0])  # replicas agree
    assert _bits(skipped) == _bits(applied)
    assert [int(s) for s in skipped[-2:]] == [1, 1]
    assert scale == 2.0**14


@pytest.mark.parametrize("opt", [
    "sgd", None, keras.optimizers.SGD(0.1),
], ids=["string", "None", "keras-optimizer"])
def test_non_v1_optimizer_is_rejected_naming_it(opt):
    with tf.Graph().as_default():
        with pytest.raises(TypeError, match="tf.compat.v1.train.Optimizer"):
            MixedPrecisionLossScaleOptimizer(opt, "dynamic")
        assert v1.global_variables() == []


@pytest.mark.parametrize("opt", [
    "sgd", None, keras.optimizers.SGD(0.1),
], ids=["string", "None", "keras-optimizer"])
def test_non_v1_optimizer_raises_what_tensorflow_raises_too(opt):
    """TensorFlow's class raises ValueError here; ours is one as well."""
    with tf.Graph().as_default():
        with pytest.raises(ValueError) as theirs:
            v1.mixed_precision.MixedPrecisionLossScaleOptimizer(opt, "dynamic")
        with pytest.raises(ValueError) as ours:
            MixedPrecisionLossScaleOptimizer(opt, "dynamic")
    assert type(theirs.value) is ValueError
    assert isinstance(ours.value, TypeError)
    assert "must be a tf.compat.v1.train.Optimizer" in str(ours.value)


def _graph_trace(make_opt, factors):
    """Runs `minimize(sum(var * factor))` once per factor in a TF1 session;
    the variable and every loss scale of the (nested) optimizer after each."""
    with tf.Graph().as_default(), v1.Session() as sess:
        var = tf.Variable([1.0, 2.0])
        opt = make_opt()
        scales, inner = [], opt
        # TensorFlow's class has these two only as private attributes.
        while hasattr(inner, "_loss_scale"):
            scales.append(inner._loss_scale())
            inner = inner._optimizer
        factor = v1.placeholder(tf.float32, [])
        train = opt.minimize(tf.reduce_sum(var * factor), var_list=[var])
        sess.run(v1.global_variables_initializer())
        trace = []
        for f in factors:
            sess.run(train, {factor: f})
            trace.append((sess.run(var).tolist(),
                          [float(x) for x in sess.run(scales)]))
        return trace


@pytest.mark.parametrize("inner_wrapper", [
    MixedPrecisionLossScaleOptimizer,
    v1.mixed_precision.MixedPrecisionLossScaleOptimizer,
], ids=["ours_inside", "tensorflows_inside"])
def test_a_wrapped_optimizer_wraps_again_as_tensorflows_does(inner_wrapper):
    def wrapped_twice(outer):
        return lambda: outer(inner_wrapper(
            v1.train.GradientDescentOptimizer(0.5),
            v1.mixed_precision.DynamicLossScale(4.0, 1)),
            v1.mixed_precision.DynamicLossScale(8.0, 2))

    factors = [1.0, 2.0, np.nan, 4.0]
    ours = _graph_trace(wrapped_twice(MixedPrecisionLossScaleOptimizer),
                        factors)
    theirs = _graph_trace(wrapped_twice(
        v1.mixed_precision.MixedPrecisionLossScaleOptimizer), factors)
    assert ours == theirs
    # The NaN step is skipped by the outer wrapper: the inner one's scale
    # does not move either.
    assert ours == [([0.5, 1.5], [8.0, 8.0]), ([-0.5, 0.5], [16.0, 16.0]),
                    ([-0.5, 0.5], [8.0, 16.0]), ([-2.5, -1.5], [8.0, 32.0])]


@pytest.mark.parametrize("tf_loss_scale", [
    lambda: v1.mixed_precision.DynamicLossScale(4.0, 2, 2.0),
    lambda: v1.mixed_precision.FixedLossScale(4.0),
], ids=["dynamic", "fixed"])
def test_tensorflows_own_loss_scale_is_taken_as_tensorflows_class_takes_it(
        tf_loss_scale, tmp_path):
    def make(wrapper):
        return lambda: wrapper(v1.train.GradientDescentOptimizer(0.5),
                               tf_loss_scale())

    factors = [1.0, 1.0, 1.0, 8.0]
    ours = _graph_trace(make(MixedPrecisionLossScaleOptimizer), factors)
    theirs = _graph_trace(make(
        v1.mixed_precision.MixedPrecisionLossScaleOptimizer), factors)
    assert ours == theirs
    assert [var for var, _ in ours] == [
        [0.5, 1.5], [0.0, 1.0], [-0.5, 0.5], [-4.5, -3.5]]
    # The same object, tracked under TensorFlow's key.
    with tf.Graph().as_default():
        loss_scale = tf_loss_scale()
        opt = MixedPrecisionLossScaleOptimizer(
            v1.train.GradientDescentOptimizer(0.5), loss_scale)
        assert opt.loss_scale is loss_scale
    keys = []
    for wrapper in (MixedPrecisionLossScaleOptimizer,
                    v1.mixed_precision.MixedPrecisionLossScaleOptimizer):
        loss_scale = tf_loss_scale()
        opt = wrapper(v1.train.GradientDescentOptimizer(0.5), loss_scale)
        path = tf.train.Checkpoint(optimizer=opt).save(
            str(tmp_path / wrapper.__module__ / "ckpt"))
        keys.append(sorted(name for name, _ in tf.train.list_variables(path)))
    assert keys[0] == keys[1] == sorted(
        ["_CHECKPOINTABLE_OBJECT_GRAPH",
         "save_counter/.ATTRIBUTES/VARIABLE_VALUE"] + (
            ["optimizer/loss_scale/current_loss_scale/.ATTRIBUTES/"
             "VARIABLE_VALUE",
             "optimizer/loss_scale/good_steps/.ATTRIBUTES/VARIABLE_VALUE"]
            if isinstance(loss_scale, v1.mixed_precision.DynamicLossScale)
            else []))


@pytest.mark.parametrize("loss_scale, message", [
    (None, "loss_scale cannot be None: .* got None, which"),
    ("Dynamic", "got 'Dynamic' of type str"),
    (0.5, "got 0.5: loss_scale_value must be"),
    (True, "got True of type bool"),
], ids=["None", "bad-string", "below-one", "bool"])
def test_bad_loss_scale_raises_value_error_naming_it(loss_scale, message):
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match=message) as info:
            MixedPrecisionLossScaleOptimizer(
                v1.train.GradientDescentOptimizer(1.0), loss_scale)
        assert v1.global_variables() == []
    assert "'dynamic', an int or float >= 1" in str(info.value)


def test_none_loss_scale_message_contains_tensorflows_phrase():
    """Code matching TensorFlow's message keeps matching ours."""
    messages = []
    for wrapper in (v1.mixed_precision.MixedPrecisionLossScaleOptimizer,
                    MixedPrecisionLossScaleOptimizer):
        with tf.Graph().as_default():
            with pytest.raises(ValueError) as info:
                wrapper(v1.train.GradientDescentOptimizer(1.0), None)
        messages.append(str(info.value))
    assert messages[0] == "loss_scale cannot be None"
    assert messages[1].startswith("loss_scale cannot be None")


def test_apply_gradients_in_cross_replica_context_raises(mirrored_strategy):
    with tf.Graph().as_default(), mirrored_strategy.scope():
        w = _variable("w", 1.0)
        opt = MixedPrecisionLossScaleOptimizer(
            v1.train.GradientDescentOptimizer(1.0), "dynamic")
        with pytest.raises(RuntimeError, match="must be called in a replica"):
            opt.apply_gradients([(tf.constant(1.0), w)])


def test_apply_gradients_without_any_gradient_raises():
    with tf.Graph().as_default():
        w = _variable("w", 1.0)
        opt = MixedPrecisionLossScaleOptimizer(
            v1.train.GradientDescentOptimizer(1.0), "dynamic")
        with pytest.raises(ValueError, match="No gradients provided"):
            opt.apply_gradients([(None, w)])
        with pytest.raises(ValueError, match="no \\(gradient, variable\\)"):
            opt.apply_gradients([])


def _readme_block(section):
    text = README.read_text()
    body = text.split(f"<!-- section:{section} -->", 1)[1]
    body = body.split("<!-- section:", 1)[0]
    return re.search(r"```python\n(.*?)```", body, re.S).group(1)


def test_readme_tf1_example_runs_as_written():
    namespace = {}
    exec(compile(_readme_block("tf1"), "docs/custom-loops.md:tf1", "exec"), namespace)
    np.testing.assert_allclose(
        namespace["w_after_one_step"], [[0.025], [0.0125]], rtol=1e-6)
