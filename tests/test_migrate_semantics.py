"""`migrate` decides from bindings, scopes and control flow, not from text
(issue 33, item 1): each pattern runs as a legacy program under the shim and
migrated without it (Keras 3, this process), or its line is reported."""

import textwrap

import _legacy_programs
import numpy as np
import pytest

from tf_lossscale.compat import migrate


def _rewrite(source):
    return migrate.rewrite(textwrap.dedent(source))


def _both(source, name="var"):
    source = textwrap.dedent(source)
    new, notes = migrate.rewrite(source)
    assert notes == [], notes
    return (_legacy_programs.run(source, shim=True)[name],
            _legacy_programs.run(new, shim=False)[name], new)


# The custom train_step of TensorFlow's "Customizing what happens in fit"
# guide: no scaling call, gradients applied as computed.
GUIDE_TRAIN_STEP = """\
    import numpy as np
    import tensorflow as tf
    from tensorflow.keras.mixed_precision import experimental as mp

    class Guide(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = tf.keras.layers.Dense(
                1, dtype='float32', kernel_initializer='ones', use_bias=False)

        def call(self, x):
            return self.dense(x)

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(self(x) - y))
            grads = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
            return {'loss': loss}

    {policy}
    model = Guide()
    model.compile(optimizer=tf.keras.optimizers.SGD(0.1))
    model.fit(np.ones((4, 2), 'float32'), np.zeros((4, 1), 'float32'),
              epochs=2, batch_size=4, verbose=0)
    var = model.dense.kernel.numpy()
    tf.keras.mixed_precision.set_global_policy('float32')
    """


def test_compile_under_tf23_policy_api_trains_as_under_the_shim():
    shim, migrated, new = _both(GUIDE_TRAIN_STEP.replace(
        "{policy}", "mp.set_policy('mixed_float16')"))
    assert ("optimizer=tf_lossscale.experimental.LossScaleOptimizer("
            "tf.keras.optimizers.SGD(0.1), 'dynamic')") in new
    assert not np.allclose(shim, 1.0, atol=1e-3)  # It trained.
    np.testing.assert_allclose(migrated, shim, rtol=1e-3)


@pytest.mark.parametrize("fp16", [False, True])
def test_policy_set_in_one_branch_wraps_only_when_it_is_set(fp16):
    source = GUIDE_TRAIN_STEP.replace(
        "{policy}", f"if {fp16}:\n        "
        "tf.keras.mixed_precision.set_global_policy('mixed_float16')").replace(
        "var = model.dense.kernel.numpy()",
        "var = model.dense.kernel.numpy()\n    "
        "kind = type(model.optimizer).__name__")
    new, notes = _rewrite(source)
    assert notes == []
    assert ("if tf.keras.mixed_precision.global_policy().name == "
            "'mixed_float16' else tf.keras.optimizers.SGD(0.1)") in new
    migrated = _legacy_programs.run(new, shim=False)
    if not fp16:  # float32: nothing wraps it, as compile did not.
        assert migrated["kind"] == "SGD"
        np.testing.assert_allclose(
            migrated["var"], _legacy_programs.run(
                textwrap.dedent(source), shim=True)["var"], rtol=1e-6)
    else:
        assert migrated["kind"].endswith("LossScaleOptimizer")


def test_scaling_call_on_a_same_named_variable_elsewhere_changes_nothing():
    shim, migrated, new = _both("""\
        import tensorflow as tf

        def accumulate(var):
            opt = tf.keras.mixed_precision.experimental.LossScaleOptimizer(
                tf.keras.optimizers.SGD(0.1), 'dynamic')
            opt.apply_gradients([(tf.constant(1.0), var)])

        def scaled(other):
            opt = tf.keras.mixed_precision.experimental.LossScaleOptimizer(
                tf.keras.optimizers.SGD(0.1), 'dynamic')
            return opt.get_scaled_loss(other)

        var = tf.Variable(1.0)
        accumulate(var)
        var = var.numpy()
        """)
    # The first is TF 2.4's class (no scaling call on *its* opt), the
    # second the current one.
    assert new.count("tf_lossscale.experimental.LossScaleOptimizer(") == 1
    assert new.count("tf_lossscale.LossScaleOptimizer(") == 1
    assert shim == pytest.approx(0.9)
    assert migrated == pytest.approx(0.9)


def test_scaling_call_on_a_models_optimizer_converts_no_other_optimizer():
    shim, migrated, new = _both("""\
        import tensorflow as tf

        def step(model, loss):
            return model.optimizer.get_scaled_loss(loss)

        opt = tf.keras.mixed_precision.experimental.LossScaleOptimizer(
            tf.keras.optimizers.SGD(0.1), 'dynamic')
        var = tf.Variable(1.0)
        opt.apply_gradients([(tf.constant(1.0), var)])
        var = var.numpy()
        """)
    assert "tf_lossscale.experimental.LossScaleOptimizer(" in new
    assert shim == pytest.approx(0.9)
    assert migrated == pytest.approx(0.9)


def test_a_parameter_shadows_a_module_level_optimizer():
    new, notes = _rewrite("""\
        import tensorflow as tf
        opt = tf.keras.mixed_precision.experimental.LossScaleOptimizer(
            tf.keras.optimizers.SGD(0.1), 'dynamic')

        def train(opt, loss):
            return opt.get_scaled_loss(loss)
        """)
    assert notes == []
    assert "opt = tf_lossscale.experimental.LossScaleOptimizer(" in new


def test_subclass_and_bare_reference_of_the_experimental_class_are_reported():
    new, notes = _rewrite("""\
        import tensorflow as tf
        from tensorflow.keras.mixed_precision.experimental import LossScaleOptimizer

        class Mine(tf.keras.mixed_precision.experimental.LossScaleOptimizer):
            pass

        wrapper = LossScaleOptimizer
        checked = isinstance(opt, tf.keras.mixed_precision.experimental.LossScaleOptimizer)
        """)
    assert [n.line for n in notes] == [4, 7]
    assert all("is used here, not called (a base class, a variable): "
               "written as tf_lossscale.experimental.LossScaleOptimizer"
               in n.reason for n in notes)
    assert "class Mine(tf_lossscale.experimental.LossScaleOptimizer):" in new
    assert "wrapper = tf_lossscale.experimental.LossScaleOptimizer" in new
    # isinstance: the current class, a base of both, answers as before.
    assert "isinstance(opt, tf_lossscale.LossScaleOptimizer)" in new
    assert migrate.rewrite(new) == (new, [])


def test_loss_scale_of_what_may_be_a_policy_is_reported():
    _, notes = _rewrite("""\
        import tensorflow as tf
        from tensorflow.keras.mixed_precision import experimental as mp

        def build(flag):
            policy = None
            if flag:
                policy = mp.Policy('mixed_float16')
            return policy

        policy = build(True)
        if policy is not None:
            scale = policy.loss_scale
        """)
    assert [n.line for n in notes] == [12]
    assert notes[0].reason.startswith(
        "policy.loss_scale: the rewriter cannot tell whether policy is a "
        "dtype policy")


def test_large_module_is_rewritten_in_linear_time():
    import time

    import _big_legacy_file
    small, large = (_big_legacy_file.source(n) for n in (500, 2000))
    times = []
    for source in (small, large):
        start = time.process_time()
        new, notes = migrate.rewrite(source)
        times.append(time.process_time() - start)
        assert notes == [] and "tf_lossscale.LossScaleOptimizer(" in new
    # Four times the lines: well under sixteen times the time (quadratic).
    assert times[1] < 8 * times[0] + 1.0, times


def test_a_reason_quoting_code_of_several_lines_is_one_line():
    _, notes = _rewrite("""\
        import tensorflow as tf
        tf.keras.mixed_precision.set_global_policy('mixed_float16')
        model.compile(optimizer=make(
                          'sgd'),
                      loss='mse')
        """)
    assert len(notes) == 1
    assert "\n" not in notes[0].reason
    assert "whether make( 'sgd') is already a LossScaleOptimizer" in (
        notes[0].reason)


def test_compile_with_the_guides_train_step_trains_as_tf215_did():
    # TF 2.4-2.15's class applied the gradients of a train_step without
    # scaling calls as given: the kernel trains as without any wrapper (the
    # Dense layer computes in float32), not 1/32768 as fast.
    source = GUIDE_TRAIN_STEP.replace(
        "{policy}",
        "tf.keras.mixed_precision.set_global_policy('mixed_float16')")
    new, notes = _rewrite(source)
    assert notes == []
    assert ("optimizer=tf_lossscale.experimental.LossScaleOptimizer("
            "tf.keras.optimizers.SGD(0.1), 'dynamic')") in new
    plain = _legacy_programs.run(textwrap.dedent(GUIDE_TRAIN_STEP.replace(
        "{policy}", "").replace(
        "from tensorflow.keras.mixed_precision import experimental as mp",
        "")), shim=False)["var"]
    migrated = _legacy_programs.run(new, shim=False)["var"]
    assert not np.allclose(plain, 1.0, atol=1e-2)
    np.testing.assert_allclose(migrated, plain, rtol=1e-6)


def test_a_large_module_parsed_in_pieces_is_rewritten_as_if_whole(
        monkeypatch):
    import _big_legacy_file

    from tf_lossscale.compat import rewrite as rewriter
    pieces = "".join(
        f"# before {i}\n\n@decorate\ndef f{i}(x):\n    # inside\n"
        f"    return x\n    # after the body\n# after {i}\n\n"
        for i in range(40))
    source = (_big_legacy_file.source(400).replace(
        "def step_3(", pieces + "def step_3(") + "# the end\n")
    whole = migrate.rewrite(source)
    monkeypatch.setattr(rewriter, "CHUNK_LINES", 37)
    assert len(rewriter._parse(source).body) > 40
    assert rewriter._parse(source).code == source
    assert migrate.rewrite(source) == whole
    assert whole[0] != source


def test_policy_loss_scale_of_a_module_that_does_not_compile_is_reported():
    legacy = """\
        import tensorflow as tf
        from tensorflow.keras.mixed_precision import experimental as mp
        policy = mp.Policy('mixed_float16', loss_scale=128)
        mp.set_policy(policy)
        """
    new, notes = _rewrite(legacy)
    # compile is in another module: dropping 128 there would make Keras
    # wrap with its dynamic default (32768), skipping the first steps.
    assert [n.line for n in notes] == [3]
    assert "Policy('mixed_float16', loss_scale=128)" in new
    compiled, notes = _rewrite(legacy + "model.compile(optimizer='sgd')\n")
    assert notes == []
    assert "loss_scale" not in compiled


# Gradient accumulation in the style of OpenNMT-tf and ALBERT pretraining:
# the documented flow unscales in one tf.function, another applies the sum.
# Here the apply function is traced first, by an apply of zero gradients
# (which creates the optimizer's slots before a checkpoint is restored).
ACCUMULATION = """\
    import numpy as np
    import tensorflow as tf

    var = tf.Variable([1.0, 2.0])
    opt = tf.keras.mixed_precision.LossScaleOptimizer(
        tf.keras.optimizers.SGD(0.25))
    accumulated = tf.Variable([0.0, 0.0], trainable=False)

    @tf.function
    def accumulate(x):
        with tf.GradientTape() as tape:
            loss = opt.get_scaled_loss(tf.reduce_sum(x * var))
        grads = opt.get_unscaled_gradients(tape.gradient(loss, [var]))
        accumulated.assign_add(grads[0])

    @tf.function
    def apply():
        opt.apply_gradients([(accumulated.read_value(), var)])
        accumulated.assign(tf.zeros_like(accumulated))

    apply()
    steps = []
    for x in ([1.0, 2.0], [3.0, 4.0]):
        for _ in range(2):
            accumulate(tf.constant(x))
        apply()
        steps.append(var.numpy().copy())
    var = np.stack(steps)
    """


def test_accumulation_whose_apply_is_traced_first_trains_as_tf215_did():
    shim, migrated, new = _both(ACCUMULATION)
    # TF 2.4-2.15 applied the accumulated (unscaled) sums as given:
    # [1, 2] - 0.25 * 2 * [1, 2], then - 0.25 * 2 * [3, 4].
    expected = [[0.5, 1.0], [-1.0, -1.0]]
    np.testing.assert_array_equal(shim, expected)
    np.testing.assert_array_equal(migrated, expected)
    assert "opt = tf_lossscale.compat.LossScaleOptimizer(" in new
    assert migrate.rewrite(new) == (new, [])


def test_accumulation_traced_in_order_keeps_the_current_class():
    # Each apply_gradients follows the scaling calls in its function: the
    # current class takes its gradients as unscaled, as TF 2.15's did.
    source = ACCUMULATION.replace(
        "opt.apply_gradients([(accumulated.read_value(), var)])",
        "opt.apply_gradients(zip(opt.get_unscaled_gradients(\n"
        "            [accumulated * opt.loss_scale]), [var]))")
    shim, migrated, new = _both(source)
    assert "opt = tf_lossscale.LossScaleOptimizer(" in new
    np.testing.assert_allclose(migrated, shim, rtol=1e-6)
