"""TF1 graph-mode cases in a process that first calls disable_v2_behavior().

Run by `tests/test_v1_disable_v2.py` as `python tests/_v1_disable_v2_cases.py`
(never collected by pytest: TF2 behaviour must be off before anything else
runs, and it cannot be turned back on). That is how most TF1 scripts start:
afterwards `TensorShape` dimensions are `Dimension` objects, variables are
reference (non-resource) variables, control flow is TF1's, and there is no
eager execution.

Each `case_*` function holds plain asserts; wherever TensorFlow's own
`tf.compat.v1.mixed_precision` class runs the same scenario, the case runs
it on both and compares. The script prints one JSON line:
`{"<case>": "ok" | "<exception type>: <message>"}`.
"""

import json
import os
import sys
import tempfile
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_v2_behavior()

import tf_lossscale  # noqa: E402

v1 = tf.compat.v1
TF = v1.mixed_precision
NAN, INF = float("nan"), float("inf")
IMPLEMENTATIONS = {
    "ours": (tf_lossscale.MixedPrecisionLossScaleOptimizer,
             tf_lossscale.DynamicLossScale, tf_lossscale.FixedLossScale),
    "tf": (TF.MixedPrecisionLossScaleOptimizer, TF.DynamicLossScale,
           TF.FixedLossScale),
}


def _is_reference_variable(variable):
    return variable.op.type == "VariableV2"


def _children(obj):
    return tf.train.TrackableView(obj).children(obj)


def case_the_process_is_in_tf1_mode():
    assert not tf.executing_eagerly()
    with tf.Graph().as_default():
        variable = v1.get_variable("v", shape=[3, 2])
        assert _is_reference_variable(variable)
        assert isinstance(variable.shape[1], tf.compat.v1.Dimension)


def _train(kind, make_inner, loss_scale_args, values, extra_vars=False):
    """Runs `minimize` on a small model; returns the state after each step.

    Model: `w` (3,), two (2, 2) matrices (same trailing shape, so the
    finiteness check buckets them together) and an embedding `e` (4, 2)
    read with tf.gather (a sparse gradient); all reference variables.
    """
    opt_cls, dynamic_cls, _ = IMPLEMENTATIONS[kind]
    out = []
    with tf.Graph().as_default(), v1.Session() as sess:
        w = v1.get_variable("w", initializer=np.float32([1.0, -2.0, 3.0]))
        a = v1.get_variable("a", initializer=np.ones([2, 2], np.float32))
        b = v1.get_variable("b", initializer=np.full([2, 2], 2, np.float32))
        e = v1.get_variable("e", initializer=np.arange(
            8, dtype=np.float32).reshape(4, 2))
        assert all(_is_reference_variable(v) for v in (w, a, b, e))
        c = v1.placeholder(tf.float32, [3])
        ids = v1.placeholder(tf.int32, [None])
        step = v1.train.get_or_create_global_step()
        if loss_scale_args[0] == "dynamic":
            loss_scale = dynamic_cls(*loss_scale_args[1:])
        elif loss_scale_args[0] == "tensorflows":  # TF's class, for both.
            loss_scale = TF.DynamicLossScale(*loss_scale_args[1:])
        else:  # ("as_is", 8) or ("as_is", "dynamic")
            loss_scale = loss_scale_args[1]
        inner = make_inner()
        opt = opt_cls(inner, loss_scale)
        loss = (tf.reduce_sum(w * c) + tf.reduce_sum(a * c[0])
                + tf.reduce_sum(b * c[1]) + tf.reduce_sum(
                    tf.gather(e, ids) * c[2]))
        grads_and_vars = opt.compute_gradients(loss)
        assert isinstance(grads_and_vars[3][0], tf.IndexedSlices)
        train_op = opt.apply_gradients(grads_and_vars, global_step=step)
        assert isinstance(train_op, tf.Operation)
        scale = _children(opt)["loss_scale"]()
        slots = [inner.get_slot(v, n) for v in (w, a, b, e)
                 for n in inner.get_slot_names()]
        sess.run(v1.global_variables_initializer())
        for c_value, ids_value in values:
            sess.run(train_op, {c: c_value, ids: ids_value})
            state = sess.run({"w": w, "a": a, "b": b, "e": e, "step": step,
                              "scale": scale, "slots": slots})
            out.append(state)
    return out


STEPS = [
    ([1.0, 0.5, 0.25], [0, 2]),
    ([1.0, 0.5, 0.25], [1, 1]),
    ([NAN, 0.5, 0.25], [0]),       # dense NaN
    ([1.0, 0.5, INF], [3]),        # sparse Inf
    ([1.0, 3e38, 0.25], [0]),      # finite, overflows once scaled
    ([0.5, -1.0, 2.0], [2, 3]),
]


def _assert_states_equal(ours, theirs):
    assert len(ours) == len(theirs)
    for mine, tf_ in zip(ours, theirs):
        for key in ("w", "a", "b", "e", "step", "scale"):
            np.testing.assert_array_equal(mine[key], tf_[key], err_msg=key)
        for x, y in zip(mine["slots"], tf_["slots"]):
            np.testing.assert_array_equal(x, y)


def case_minimize_with_a_dynamic_scale_equals_tensorflows():
    for make_inner in (lambda: v1.train.GradientDescentOptimizer(0.5),
                       lambda: v1.train.MomentumOptimizer(0.25, 0.9),
                       lambda: v1.train.AdamOptimizer(0.1)):
        args = ("dynamic", 4.0, 2, 2.0)
        ours = _train("ours", make_inner, args, STEPS)
        _assert_states_equal(ours, _train("tf", make_inner, args, STEPS))
        # Skipped: steps 3, 4 and 5; global_step counts applied steps.
        assert [s["step"] for s in ours] == [1, 2, 2, 2, 2, 3]
        assert [float(s["scale"]) for s in ours] == [4, 8, 4, 2, 1, 1]
        np.testing.assert_array_equal(ours[2]["w"], ours[1]["w"])


def case_tensorflows_loss_scale_and_a_wrapped_inner_as_tensorflow():
    """TensorFlow's class takes its own LossScale objects and an optimizer
    that is already loss-scaled; so does ours, with the same results."""
    for make_inner in (
            lambda: v1.train.GradientDescentOptimizer(0.5),
            lambda: TF.MixedPrecisionLossScaleOptimizer(
                v1.train.GradientDescentOptimizer(0.5), 4)):
        args = ("tensorflows", 4.0, 2, 2.0)
        ours = _train("ours", make_inner, args, STEPS)
        _assert_states_equal(ours, _train("tf", make_inner, args, STEPS))
        assert [float(s["scale"]) for s in ours] == [4, 8, 4, 2, 1, 1]


def case_minimize_with_the_default_dynamic_scale():
    make_inner = lambda: v1.train.GradientDescentOptimizer(1.0)  # noqa: E731
    values = [([1.0, 1.0, 1.0], [0])] * 3
    ours = _train("ours", make_inner, ("as_is", "dynamic"), values)
    _assert_states_equal(ours, _train("tf", make_inner, ("as_is", "dynamic"),
                                      values))
    assert float(ours[-1]["scale"]) == 2.0**15


def case_minimize_with_a_fixed_scale_equals_tensorflows_on_finite_steps():
    make_inner = lambda: v1.train.MomentumOptimizer(0.25, 0.9)  # noqa: E731
    finite = [s for s in STEPS if np.all(np.isfinite(s[0]))][:2] + [
        ([0.5, -1.0, 2.0], [2, 3])]
    for value in (8, 1.0):
        ours = _train("ours", make_inner, ("as_is", value), finite)
        _assert_states_equal(ours, _train("tf", make_inner, ("as_is", value),
                                          finite))
        assert [s["step"] for s in ours] == [1, 2, 3]
        assert all(float(s["scale"]) == value for s in ours)


def case_fixed_scale_skips_a_nan_step():
    """docs/differences.md: no non-finite step changes a variable or a slot,
    with a fixed scale too (TensorFlow's class applies it)."""
    make_inner = lambda: v1.train.MomentumOptimizer(0.25, 0.9)  # noqa: E731
    values = [([1.0, 0.5, 0.25], [0]), ([NAN, 0.5, 0.25], [0])]
    theirs = _train("tf", make_inner, ("as_is", 8), values)
    assert np.isnan(theirs[1]["w"][0])
    ours = _train("ours", make_inner, ("as_is", 8), values)
    np.testing.assert_array_equal(ours[1]["w"], ours[0]["w"])
    for x, y in zip(ours[1]["slots"], ours[0]["slots"]):
        np.testing.assert_array_equal(x, y)


def _update_trajectory(kind, args, flags):
    _, dynamic_cls, _ = IMPLEMENTATIONS[kind]
    out = []
    with tf.Graph().as_default(), v1.Session() as sess:
        loss_scale = dynamic_cls(*args)
        dense = v1.placeholder(tf.float32, [2])
        sparse = tf.IndexedSlices(v1.placeholder(tf.float32, [1, 2]),
                                  tf.constant([1]), tf.constant([3, 2]))
        update_op, should_apply = loss_scale.update([dense, None, sparse])
        assert isinstance(update_op, tf.Tensor), type(update_op)
        assert update_op.dtype == tf.bool
        assert isinstance(should_apply, tf.Tensor)
        with tf.control_dependencies([update_op]):
            identity = tf.identity(update_op)
        good_steps = _children(loss_scale)["good_steps"]
        repr_text = repr(loss_scale)
        sess.run(v1.global_variables_initializer())
        for i, flag in enumerate(flags):
            feed = {dense: [1.0, NAN if flag == "nan" else 2.0],
                    sparse.values: [[INF if flag == "inf" else 1.0, 0.0]]}
            op = identity if i % 2 else update_op
            ran = sess.run([op, should_apply], feed)
            out.append((bool(ran[0]), bool(ran[1]),
                        float(sess.run(loss_scale())),
                        int(sess.run(good_steps))))
    return out, repr_text


def case_dynamic_loss_scale_update_ops_equal_tensorflows():
    flags = ["ok", "ok", "nan", "ok", "inf", "ok", "ok", "ok"]
    for args in [(4.0, 2, 2.0), (1.0, 1, 3.0), (2.0, 3.0, 2.0)]:
        ours, our_repr = _update_trajectory("ours", args, flags)
        theirs, their_repr = _update_trajectory("tf", args, flags)
        assert ours == theirs, (args, ours, theirs)
        assert our_repr == their_repr
    # (update op value, verdict, scale, good steps) with (4, 2, 2):
    assert _update_trajectory("ours", (4.0, 2, 2.0), flags)[0] == [
        (False, True, 4.0, 1), (True, True, 8.0, 0), (False, False, 4.0, 0),
        (False, True, 4.0, 1), (False, False, 2.0, 0), (False, True, 2.0, 1),
        (True, True, 4.0, 0), (False, True, 4.0, 1)]


def case_fixed_loss_scale_update_is_an_op_and_true():
    for kind in ("ours", "tf"):
        with tf.Graph().as_default(), v1.Session() as sess:
            loss_scale = IMPLEMENTATIONS[kind][2](16)
            update_op, should_apply = loss_scale.update([tf.constant([NAN])])
            assert isinstance(update_op, tf.Operation)
            assert should_apply is True
            assert sess.run(loss_scale()) == 16.0


def case_float16_variables_get_the_exact_unscaled_update():
    """Ours takes float16 variables (TensorFlow's class raises TypeError
    there: it multiplies a float16 gradient by a float32 reciprocal)."""
    with tf.Graph().as_default(), v1.Session() as sess:
        h = v1.get_variable("h", initializer=np.float16([1.0, 2.0]))
        assert _is_reference_variable(h)
        x = v1.placeholder(tf.float16, [2])
        opt = tf_lossscale.MixedPrecisionLossScaleOptimizer(
            v1.train.GradientDescentOptimizer(1.0),
            tf_lossscale.DynamicLossScale(1024.0, 1, 2.0))
        train_op = opt.minimize(tf.reduce_sum(h * x))
        sess.run(v1.global_variables_initializer())
        # Scaled by 1024 and divided again, the float16 gradient is exact.
        tiny = np.float16(2.0**-14)
        sess.run(train_op, {x: [tiny, tiny]})
        np.testing.assert_array_equal(sess.run(h), np.float16(
            [1.0, 2.0]) - tiny)
        assert sess.run(opt.loss_scale()) == 2048.0
        sess.run(train_op, {x: [np.float16(60000.0), 0.0]})  # overflows
        np.testing.assert_array_equal(sess.run(h), np.float16(
            [1.0, 2.0]) - tiny)
        assert sess.run(opt.loss_scale()) == 1024.0
    with tf.Graph().as_default():
        h = v1.get_variable("h", initializer=np.float16([1.0, 2.0]))
        opt = TF.MixedPrecisionLossScaleOptimizer(
            v1.train.GradientDescentOptimizer(1.0), "dynamic")
        try:
            opt.minimize(tf.reduce_sum(h))
        except TypeError:
            pass
        else:
            raise AssertionError("TensorFlow's class took float16 now")


def _saver_round_trip(writer_kind, reader_kind):
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "model")
        with tf.Graph().as_default(), v1.Session() as sess:
            w = v1.get_variable("w", initializer=np.float32([1.0, 2.0]))
            x = v1.placeholder(tf.float32, [2])
            opt = IMPLEMENTATIONS[writer_kind][0](
                v1.train.MomentumOptimizer(0.5, 0.9),
                IMPLEMENTATIONS[writer_kind][1](8.0, 2, 2.0))
            train_op = opt.minimize(tf.reduce_sum(w * x),
                                    global_step=v1.train.get_or_create_global_step())
            sess.run(v1.global_variables_initializer())
            for value in ([1.0, 1.0], [1.0, 1.0], [NAN, 1.0], [1.0, 0.5]):
                sess.run(train_op, {x: value})
            saved = sess.run(v1.global_variables())
            names = sorted(v.op.name for v in v1.global_variables())
            v1.train.Saver().save(sess, path)
        with tf.Graph().as_default(), v1.Session() as sess:
            w = v1.get_variable("w", initializer=np.float32([0.0, 0.0]))
            opt = IMPLEMENTATIONS[reader_kind][0](
                v1.train.MomentumOptimizer(0.5, 0.9),
                IMPLEMENTATIONS[reader_kind][1](2.0, 5, 2.0))
            opt.minimize(tf.reduce_sum(w),
                         global_step=v1.train.get_or_create_global_step())
            assert sorted(v.op.name for v in v1.global_variables()) == names
            v1.train.Saver().restore(sess, path)
            restored = sess.run(v1.global_variables())
            scale = sess.run(_children(opt)["loss_scale"]())
    for a, b in zip(saved, restored):
        np.testing.assert_array_equal(a, b)
    return names, float(scale)


def case_saver_round_trips_between_ours_and_tensorflows():
    for writer, reader in [("ours", "ours"), ("ours", "tf"), ("tf", "ours")]:
        names, scale = _saver_round_trip(writer, reader)
        assert "current_loss_scale" in names and "good_steps" in names
        assert scale == 8.0, (writer, reader, scale)


def _object_checkpoint(writer_kind, reader_kind, make_inner):
    with tempfile.TemporaryDirectory() as directory:
        with tf.Graph().as_default(), v1.Session() as sess:
            w = v1.get_variable("w", initializer=np.float32([1.0, 2.0]))
            opt = IMPLEMENTATIONS[writer_kind][0](
                make_inner(), IMPLEMENTATIONS[writer_kind][1](8.0, 1, 2.0))
            train_op = opt.minimize(tf.reduce_sum(w))
            sess.run(v1.global_variables_initializer())
            sess.run(train_op)
            path = v1.train.Checkpoint(optimizer=opt, w=w).save(
                os.path.join(directory, "ckpt"), session=sess)
        with tf.Graph().as_default(), v1.Session() as sess:
            w = v1.get_variable("w", initializer=np.float32([0.0, 0.0]))
            opt = IMPLEMENTATIONS[reader_kind][0](
                make_inner(), IMPLEMENTATIONS[reader_kind][1](2.0, 5, 2.0))
            opt.minimize(tf.reduce_sum(w))
            status = v1.train.Checkpoint(optimizer=opt, w=w).restore(path)
            status.assert_consumed().run_restore_ops(sess)
            return sess.run([w, _children(opt)["loss_scale"]()])


def case_object_checkpoint_round_trips_between_ours_and_tensorflows():
    for writer, reader in [("ours", "tf"), ("tf", "ours"), ("ours", "ours")]:
        w, scale = _object_checkpoint(
            writer, reader, lambda: v1.train.GradientDescentOptimizer(0.5))
        np.testing.assert_array_equal(w, [0.5, 1.5])
        assert scale == 16.0


def case_object_checkpoint_with_slots_round_trips():
    for writer, reader in [("ours", "tf"), ("tf", "ours")]:
        w, scale = _object_checkpoint(
            writer, reader, lambda: v1.train.MomentumOptimizer(0.5, 0.9))
        np.testing.assert_array_equal(w, [0.5, 1.5])
        assert scale == 16.0


def main():
    results = {}
    for name, case in sorted(globals().items()):
        if not name.startswith("case_"):
            continue
        try:
            case()
            results[name] = "ok"
        except Exception as e:  # noqa: BLE001 - reported, not hidden
            traceback.print_exc(file=sys.stderr)
            results[name] = f"{type(e).__name__}: {e}"[:2000]
    print("RESULTS " + json.dumps(results))


if __name__ == "__main__":
    main()
