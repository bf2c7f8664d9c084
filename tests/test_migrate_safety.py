"""`migrate` is never silently wrong (issue 19): what it writes computes what
the original computes under the shim, or it exits 1 naming the line.

Each test runs a small legacy program under the shim and its migrated text
without it, in this process (Keras 3), and compares the numbers; or checks
that the line is named.
"""

import textwrap

import _legacy_programs
import numpy as np
import pytest

import tf_lossscale
import tf_lossscale.compat
from tf_lossscale.compat import migrate


def _migrated(source):
    new, notes = migrate.rewrite(textwrap.dedent(source))
    assert notes == [], notes
    return new


def _both(source, name="var"):
    """(value under the shim, value after migrate) of global `name`."""
    source = textwrap.dedent(source)
    return (np.asarray(_legacy_programs.run(source, shim=True)[name]),
            np.asarray(_legacy_programs.run(_migrated(source), shim=False)[name]))


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


# Item 2: every way real code names TensorFlow and Keras.

# A step with TF 2.4's documented flow, through `{mp}` (the module the
# spelling reaches `mixed_precision` by).
_STEP = """\
    opt = {lso}(tf.keras.optimizers.SGD(0.5){extra})
    var = tf.Variable(1.0)
    with tf.GradientTape() as tape:
        loss = opt.get_scaled_loss(var * 3.0)
    grads = opt.get_unscaled_gradients(tape.gradient(loss, [var]))
    opt.apply_gradients(zip(grads, [var]))
    var = var.numpy()
    """
ALIASES = [
    ("compat_v2", "import tensorflow.compat.v2 as tf\n",
     "tf.keras.mixed_precision.LossScaleOptimizer", ""),
    ("compat_v1", "import tensorflow.compat.v1 as tf\n",
     "tf.keras.mixed_precision.experimental.LossScaleOptimizer",
     ", 'dynamic'"),
    ("from_compat_import_v2", "from tensorflow.compat import v2 as tf\n",
     "tf.keras.mixed_precision.LossScaleOptimizer", ""),
    ("from_tensorflow_import_keras",
     "import tensorflow as tf\nfrom tensorflow import keras\n",
     "keras.mixed_precision.experimental.LossScaleOptimizer", ", 'dynamic'"),
    ("import_tensorflow_keras_as_keras",
     "import tensorflow as tf\nimport tensorflow.keras as keras\n",
     "keras.mixed_precision.LossScaleOptimizer", ""),
    ("from_tensorflow_keras_import_mixed_precision",
     "import tensorflow as tf\n"
     "from tensorflow.keras import mixed_precision\n",
     "mixed_precision.LossScaleOptimizer", ""),
]


@pytest.mark.parametrize("name,imports,lso,extra", ALIASES,
                         ids=[a[0] for a in ALIASES])
def test_each_spelling_of_tensorflow_and_keras_is_resolved(name, imports,
                                                          lso, extra):
    source = imports + textwrap.dedent(_STEP).format(lso=lso, extra=extra)
    new = _migrated(source)
    assert "tf_lossscale.LossScaleOptimizer(" in new, new
    assert "mixed_precision.LossScaleOptimizer" not in new
    shim, migrated = _both(source)
    assert shim == migrated == pytest.approx(1.0 - 0.5 * 3.0)


# TF 2.1-2.5 code imported from TensorFlow's private modules, which today's
# TensorFlow no longer has in that shape (the shim does not reach them).
PRIVATE = [
    ("keras_2_3_optimizer_module", """\
        import tensorflow as tf
        from tensorflow.python.keras.mixed_precision.experimental import loss_scale_optimizer as lso
        opt = lso.LossScaleOptimizer(tf.keras.optimizers.SGD(0.5), 'dynamic')
        """, "tf_lossscale.experimental.LossScaleOptimizer("),
    ("keras_2_3_policy_module", """\
        from tensorflow.python.keras.mixed_precision.experimental import policy as mixed_precision
        mixed_precision.set_policy('float32')
        """, "from tensorflow.keras import mixed_precision\n"
             "mixed_precision.set_global_policy('float32')"),
    ("keras_2_4_optimizer_module", """\
        import tensorflow as tf
        from tensorflow.python.keras.mixed_precision import loss_scale_optimizer
        opt = loss_scale_optimizer.LossScaleOptimizer(tf.keras.optimizers.SGD(0.5))
        """, "tf_lossscale.LossScaleOptimizer("),
    ("keras_2_4_v1_optimizer_by_name", """\
        import tensorflow as tf
        from tensorflow.python.keras.mixed_precision.loss_scale_optimizer import LossScaleOptimizerV1
        opt = LossScaleOptimizerV1(tf.keras.optimizers.SGD(0.5), 'dynamic')
        """, "tf_lossscale.experimental.LossScaleOptimizer("),
    ("keras_2_4_policy_module", """\
        from tensorflow.python.keras.mixed_precision import policy
        policy.set_policy('float32')
        """, "policy.set_global_policy('float32')"),
    ("training_loss_scale_module", """\
        from tensorflow.python.training.experimental import loss_scale as loss_scale_module
        ls = loss_scale_module.DynamicLossScale(initial_loss_scale=8)
        """, "ls = tf_lossscale.DynamicLossScale(initial_loss_scale=8)"),
]


@pytest.mark.parametrize("name,legacy,expected", PRIVATE,
                         ids=[p[0] for p in PRIVATE])
def test_private_keras_and_training_modules_of_tf_2_1_to_2_5_are_resolved(
        name, legacy, expected, recwarn):
    new = _migrated(legacy)
    assert expected in new, new
    assert "tensorflow.python" not in new
    namespace = _legacy_programs.run(new, shim=False)  # Runs without the shim.
    if "opt" in namespace:
        assert isinstance(namespace["opt"], tf_lossscale.LossScaleOptimizer)
    if "ls" in namespace:
        assert float(namespace["ls"]()) == 8.0


# Item 3: the graph rewrite and the loss scale it takes, together.

GRAPH_REWRITE_OF_AN_OPTIMIZER_OF_UNKNOWN_KIND = """\
    import tensorflow as tf

    def create_optimizer(learning_rate):
        return tf.compat.v1.train.GradientDescentOptimizer(learning_rate)

    loss_scaler = tf.train.experimental.DynamicLossScale(
        initial_loss_scale=2 ** 10, increment_period=1000, multiplier=2.0)
    optimizer = create_optimizer(0.1)
    optimizer = {function}(optimizer, loss_scaler)
    var = tf.Variable(1.0)
    optimizer.minimize(lambda: var * 2.0, var_list=[var])
    var = var.numpy()
    tf.config.optimizer.set_experimental_options({{'auto_mixed_precision': False}})
    """


@pytest.mark.parametrize("function", [
    "tf.train.experimental.enable_mixed_precision_graph_rewrite",
    "tf.compat.v1.train.experimental.enable_mixed_precision_graph_rewrite",
    "tf.compat.v1.mixed_precision.enable_mixed_precision_graph_rewrite"])
def test_graph_rewrite_left_unconverted_still_takes_the_converted_loss_scale(
        function):
    source = textwrap.dedent(
        GRAPH_REWRITE_OF_AN_OPTIMIZER_OF_UNKNOWN_KIND).format(function=function)
    new, notes = migrate.rewrite(source)
    # Reported: the rewriter cannot tell which wrapper TF chose ...
    assert [n.line for n in notes] == [9]
    assert "cannot tell whether optimizer is a Keras optimizer" in (
        notes[0].reason)
    # ... but never half converted: the converted loss scale is accepted.
    assert "tf_lossscale.DynamicLossScale(" in new
    assert "\nimport tf_lossscale.compat.graph_rewrite\n" in new
    shim = _legacy_programs.run(source, shim=True)["var"]
    migrated = _legacy_programs.run(new, shim=False)["var"]
    assert shim == migrated == pytest.approx(0.8)


# Item 5: after --write, the lines named are those of the file on disk.

def test_lines_reported_after_write_are_lines_of_the_written_file(
        tmp_path, capsys):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent("""\
        import tensorflow as tf
        from tensorflow.keras.mixed_precision import experimental as mp

        policy = mp.Policy('mixed_float16')
        mp.set_policy(policy)
        opt = mp.LossScaleOptimizer(tf.keras.optimizers.SGD(), 'dynamic')
        print('Loss scale: %s' % policy.loss_scale)
        ls = tf.train.experimental.DynamicLossScale()
        print(ls())
        value = opt.loss_scale.get_config()
        """))
    assert migrate.run([str(path)], write=True) == 1
    report = capsys.readouterr().err.splitlines()
    written = path.read_text().splitlines()
    named = [int(line.split(":")[1]) for line in report]
    assert [written[n - 1] for n in named] == [
        "print('Loss scale: %s' % policy.loss_scale)",
        "value = opt.loss_scale.get_config()"]
    assert report[0].endswith("[line 7 before --write]")
    # Without --write, the file stays and the lines named are its own.
    original = tmp_path / "original.py"
    original.write_text(textwrap.dedent("""\
        import tensorflow as tf
        from tensorflow.keras.mixed_precision import experimental as mp
        policy = mp.Policy('mixed_float16')
        print(policy.loss_scale)
        """))
    assert migrate.run([str(original)], write=False) == 1
    assert capsys.readouterr().err.startswith(f"{original}:4: ")


def test_line_map_follows_added_and_changed_lines():
    old = "a\nb\nc\nd\n"
    new = "a\nimport x\n\nb\nadded\nC\nd\n"
    assert migrate.line_map(old, new) == {1: 1, 2: 4, 3: 6, 4: 7, 5: 8}


# Item 6: a policy chosen by a conditional expression (google/automl style).

AUTOML_STYLE = """\
    import tensorflow as tf

    class Config:
        mixed_precision = {mixed}

    def set_precision_policy(config):
        precision = 'mixed_float16' if config.mixed_precision else 'float32'
        policy = tf.keras.mixed_precision.experimental.Policy(precision)
        tf.keras.mixed_precision.experimental.set_policy(policy)

    class DetNetTrain(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = tf.keras.layers.Dense(1, dtype='float32',
                                               kernel_initializer='ones')

        def call(self, x):
            return self.dense(x)

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(self(x) - y))
                if isinstance(self.optimizer,
                              tf.keras.mixed_precision.experimental.LossScaleOptimizer):
                    scaled_loss = self.optimizer.get_scaled_loss(loss)
                else:
                    scaled_loss = loss
            grads = tape.gradient(scaled_loss, self.trainable_variables)
            if isinstance(self.optimizer,
                          tf.keras.mixed_precision.experimental.LossScaleOptimizer):
                grads = self.optimizer.get_unscaled_gradients(grads)
            self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
            return {{'loss': loss}}

    set_precision_policy(Config())
    model = DetNetTrain()
    model.compile(optimizer=tf.keras.optimizers.SGD(0.1))
    x = tf.ones([4, 2])
    model.fit(x, tf.zeros([4, 1]), epochs=3, verbose=0)
    wrapped = type(model.optimizer).__name__
    var = model.dense.kernel.numpy()
    tf.keras.mixed_precision.set_global_policy('float32')
    """


@pytest.mark.parametrize("mixed", [True, False])
def test_policy_chosen_by_a_conditional_is_followed_at_run_time(mixed,
                                                                 recwarn):
    source = textwrap.dedent(AUTOML_STYLE).format(mixed=mixed)
    new = _migrated(source)
    # TF 2.3's policy API: compile wrapped in TF 2.3's class, which the
    # shim runs as TF 2.4's (issue 33).
    assert ("optimizer=tf_lossscale.experimental.LossScaleOptimizer("
            "tf.keras.optimizers.SGD(0.1), 'dynamic') if tf.keras."
            "mixed_precision.global_policy().name == 'mixed_float16' else "
            "tf.keras.optimizers.SGD(0.1)") in new
    shim = _legacy_programs.run(source, shim=True)
    migrated = _legacy_programs.run(new, shim=False)
    assert (shim["wrapped"] != "SGD") == mixed
    assert (migrated["wrapped"] != "SGD") == mixed
    np.testing.assert_allclose(migrated["var"], shim["var"], rtol=1e-3)
    assert not np.allclose(shim["var"], 1.0)  # It trained.


def test_lines_that_fail_under_a_compile_left_unconverted_are_named():
    source = textwrap.dedent(AUTOML_STYLE).format(mixed=True).replace(
        "Policy(precision)", "Policy(precision, loss_scale=config.scale)")
    _, notes = migrate.rewrite(source)
    lines = source.splitlines()
    named = [lines[n.line - 1].strip() for n in notes]
    assert named == [
        "policy = tf.keras.mixed_precision.experimental.Policy(precision, "
        "loss_scale=config.scale)",
        "scaled_loss = self.optimizer.get_scaled_loss(loss)",
        "grads = self.optimizer.get_unscaled_gradients(grads)",
        "model.compile(optimizer=tf.keras.optimizers.SGD(0.1))"]
    assert "has no get_scaled_loss" in notes[1].reason


# Item 7: files that cannot hold a loss-scaling name are not parsed.

def test_files_without_a_loss_scaling_name_are_skipped_and_counted(
        tmp_path, capsys, monkeypatch):
    (tmp_path / "model.py").write_text("import tensorflow as tf\nx = (\n")
    (tmp_path / "data.py").write_text("import numpy as np\n")
    (tmp_path / "train.py").write_text(
        "import tensorflow as tf\n"
        "ls = tf.train.experimental.DynamicLossScale()\n")
    parsed = []
    real = migrate.rewrite
    monkeypatch.setattr(migrate, "rewrite", lambda source, *run: (
        parsed.append(source) or real(source, *run)))
    assert migrate.run([str(tmp_path)], write=True) == 0
    assert len(parsed) == 1  # model.py would not even parse.
    assert "tf_lossscale.DynamicLossScale()" in (
        tmp_path / "train.py").read_text()
    err = capsys.readouterr().err
    assert err.startswith("migrate: 1 of 3 files parsed; 2 skipped, their "
                          "text holding none of LossScale, Policy, ")


@pytest.mark.parametrize("name", sorted(
    __import__("tf_lossscale.compat.legacy_names",
               fromlist=["x"]).LEGACY_NAMES))
def test_every_legacy_name_passes_the_text_filter(name):
    from tf_lossscale.compat import legacy_names
    member = name.rsplit(".", 1)[1]
    module = name.rsplit(".", 1)[0]
    for text in (f"import tensorflow as tf\nx = tf.{name[11:]}\n",
                 f"from {module} import {member}\n",
                 f"from {module.rsplit('.', 1)[0]} import "
                 f"{module.rsplit('.', 1)[1]} as m\nm.{member}\n"):
        assert legacy_names.may_hold_legacy_names(text), text
