# ruff: noqa: E501 (expected outputs are the rewriter's lines, unwrapped)
"""The `migrate` rewriter: legacy source in, current source out."""

import os
import subprocess
import sys
import textwrap

import keras
import pytest

import tf_lossscale
from tf_lossscale import cli, config_conversion
from tf_lossscale.compat import migrate
from tf_lossscale.compat.rewrite import loss_scale_args

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _rewrite(source):
    return migrate.rewrite(textwrap.dedent(source))


def _same(source):
    return textwrap.dedent(source)


# (name, legacy source, current source): each pair is one rule.
PAIRS = [
    ("dynamic_string_becomes_the_defaults", """\
        import tensorflow as tf
        opt = tf.keras.mixed_precision.experimental.LossScaleOptimizer(
            tf.keras.optimizers.SGD(), loss_scale='dynamic')
        scaled = opt.get_scaled_loss(loss)
        """, """\
        import tensorflow as tf
        import tf_lossscale

        opt = tf_lossscale.LossScaleOptimizer(
            tf.keras.optimizers.SGD())
        scaled = opt.get_scaled_loss(loss)
        """),
    ("number_becomes_a_fixed_initial_scale", """\
        import tensorflow as tf
        opt = tf.keras.mixed_precision.experimental.LossScaleOptimizer(
            tf.keras.optimizers.SGD(), loss_scale=123)
        opt.minimize(loss, var_list)
        """, """\
        import tensorflow as tf
        import tf_lossscale

        opt = tf_lossscale.LossScaleOptimizer(
            tf.keras.optimizers.SGD(), dynamic=False, initial_scale=123)
        opt.minimize(loss, var_list)
        """),
    ("dynamic_loss_scale_args_are_renamed", """\
        import tensorflow as tf
        loss_scale = tf.compat.v1.mixed_precision.experimental.DynamicLossScale
        opt = tf.keras.mixed_precision.experimental.LossScaleOptimizer(
            tf.keras.optimizers.SGD(),
            loss_scale=tf.train.experimental.DynamicLossScale(
                initial_loss_scale=2048, increment_period=500))
        grads = opt.get_unscaled_gradients(grads)
        """, """\
        import tensorflow as tf
        import tf_lossscale

        loss_scale = tf_lossscale.DynamicLossScale
        opt = tf_lossscale.LossScaleOptimizer(
            tf.keras.optimizers.SGD(),
            initial_scale=2048,
            dynamic_growth_steps=500)
        grads = opt.get_unscaled_gradients(grads)
        """),
    ("positional_fixed_loss_scale_and_optimizer_keyword", """\
        import tensorflow as tf
        opt = tf.keras.mixed_precision.experimental.LossScaleOptimizer(
            optimizer=sgd, loss_scale=tf.train.experimental.FixedLossScale(2 ** 7))
        grads = opt.get_unscaled_gradients(grads)
        """, """\
        import tensorflow as tf
        import tf_lossscale

        opt = tf_lossscale.LossScaleOptimizer(
            inner_optimizer=sgd, dynamic=False, initial_scale=2 ** 7)
        grads = opt.get_unscaled_gradients(grads)
        """),
    ("aliased_module_import_and_policy_api", """\
        from tensorflow.keras.mixed_precision import experimental as mixed_precision  # TF 2.3

        # Mixed precision, as the guide says.
        policy = mixed_precision.Policy('mixed_float16')
        mixed_precision.set_policy(policy)
        print(mixed_precision.global_policy())
        opt = mixed_precision.LossScaleOptimizer(sgd, 'dynamic')
        grads = opt.get_unscaled_gradients(grads)
        """, """\
        from tensorflow.keras import mixed_precision  # TF 2.3
        import tf_lossscale

        # Mixed precision, as the guide says.
        policy = mixed_precision.Policy('mixed_float16')
        mixed_precision.set_global_policy(policy)
        print(mixed_precision.global_policy())
        opt = tf_lossscale.LossScaleOptimizer(sgd)
        grads = opt.get_unscaled_gradients(grads)
        """),
    ("member_imports_move_to_their_new_modules", """\
        from tensorflow.keras.mixed_precision.experimental import (
            LossScaleOptimizer, set_policy, Policy as P)
        set_policy(P('mixed_float16', loss_scale='auto'))
        opt = LossScaleOptimizer(sgd, loss_scale=8)
        grads = opt.get_unscaled_gradients(grads)
        """, """\
        from tf_lossscale import LossScaleOptimizer
        from tensorflow.keras.mixed_precision import set_global_policy, Policy as P
        set_global_policy(P('mixed_float16'))
        opt = LossScaleOptimizer(sgd, dynamic=False, initial_scale=8)
        grads = opt.get_unscaled_gradients(grads)
        """),
    ("dotted_module_import", """\
        import tensorflow.keras.mixed_precision.experimental as mp
        mp.set_policy('mixed_float16')
        """, """\
        import tensorflow.keras.mixed_precision as mp
        mp.set_global_policy('mixed_float16')
        """),
    ("tf_mixed_precision_experimental_import_goes", """\
        from tensorflow.mixed_precision import experimental as mpe
        scale = mpe.FixedLossScale(4)
        """, """\
        import tf_lossscale

        scale = tf_lossscale.FixedLossScale(4)
        """),
    ("tf1_optimizer_under_compat_v1_alias", """\
        import tensorflow.compat.v1 as tf
        opt = tf.train.experimental.MixedPrecisionLossScaleOptimizer(
            tf.train.GradientDescentOptimizer(0.1), 'dynamic')
        other = tf.compat.v1.train.experimental.enable_mixed_precision_graph_rewrite
        """, """\
        import tensorflow.compat.v1 as tf
        import tf_lossscale

        opt = tf_lossscale.MixedPrecisionLossScaleOptimizer(
            tf.train.GradientDescentOptimizer(0.1), 'dynamic')
        other = tf.compat.v1.train.experimental.enable_mixed_precision_graph_rewrite
        """),
    ("kept_members_of_an_existing_module_stay", """\
        from tensorflow.compat.v1.mixed_precision import (
            DynamicLossScale, disable_v2_behavior_helper)
        ls = DynamicLossScale()
        """, """\
        from tensorflow.compat.v1.mixed_precision import (
            disable_v2_behavior_helper)
        from tf_lossscale import DynamicLossScale
        ls = DynamicLossScale()
        """),
    # TF 2.4-2.15: the non-experimental names.
    ("tf_2_4_optimizer_and_isinstance_become_ours", """\
        import tensorflow as tf
        from tensorflow.keras import mixed_precision

        opt = mixed_precision.LossScaleOptimizer(tf.keras.optimizers.SGD(),
                                                 dynamic=False, initial_scale=128)
        if isinstance(opt, tf.keras.mixed_precision.LossScaleOptimizer):
            print(opt.dynamic_counter)
        """, """\
        import tensorflow as tf
        from tensorflow.keras import mixed_precision
        import tf_lossscale

        opt = tf_lossscale.LossScaleOptimizer(tf.keras.optimizers.SGD(),
                                                 dynamic=False, initial_scale=128)
        if isinstance(opt, tf_lossscale.LossScaleOptimizer):
            print(opt.dynamic_counter)
        """),
    ("tf_2_4_optimizer_applied_without_scaling_keeps_tf_2_4s_rule", """\
        import tensorflow as tf
        opt = tf.keras.mixed_precision.LossScaleOptimizer(tf.keras.optimizers.SGD())
        opt.apply_gradients(zip(grads, variables))
        """, """\
        import tensorflow as tf
        import tf_lossscale
        import tf_lossscale.compat

        opt = tf_lossscale.compat.LossScaleOptimizer(tf.keras.optimizers.SGD())
        opt.apply_gradients(zip(grads, variables))
        """),
    ("tf_2_4_member_import_moves_to_tf_lossscale", """\
        from tensorflow.keras.mixed_precision import LossScaleOptimizer, Policy
        opt = LossScaleOptimizer(sgd)
        """, """\
        from tensorflow.keras.mixed_precision import Policy
        from tf_lossscale import LossScaleOptimizer
        opt = LossScaleOptimizer(sgd)
        """),
    ("legacy_loss_scale_on_the_current_class_is_converted", """\
        import tensorflow as tf
        a = tf.keras.mixed_precision.LossScaleOptimizer(sgd, loss_scale='dynamic')
        b = tf.keras.mixed_precision.LossScaleOptimizer(sgd, 1024)
        c = tf.keras.mixed_precision.LossScaleOptimizer(sgd, False, 1024)
        """, """\
        import tensorflow as tf
        import tf_lossscale

        a = tf_lossscale.LossScaleOptimizer(sgd)
        b = tf_lossscale.LossScaleOptimizer(sgd, dynamic=False, initial_scale=1024)
        c = tf_lossscale.LossScaleOptimizer(sgd, False, 1024)
        """),
    # compile's implicit wrapper becomes explicit.
    ("compile_under_mixed_float16_wraps_each_kind_of_optimizer", """\
        import tensorflow as tf
        from tensorflow.keras import mixed_precision

        mixed_precision.set_global_policy('mixed_float16')
        opt = tf.keras.optimizers.Adam(1e-3)
        model.compile(optimizer=opt, loss='mse')
        model.compile('sgd', loss='mse')
        model.compile(loss='mse')
        model.compile(optimizer=mixed_precision.LossScaleOptimizer(opt))
        def build(optimizer):
            model.compile(optimizer)
        """, """\
        import tensorflow as tf
        from tensorflow.keras import mixed_precision
        import tf_lossscale

        mixed_precision.set_global_policy('mixed_float16')
        opt = tf.keras.optimizers.Adam(1e-3)
        model.compile(optimizer=tf_lossscale.LossScaleOptimizer(opt), loss='mse')
        model.compile(tf_lossscale.LossScaleOptimizer(tf.keras.optimizers.get('sgd')), loss='mse')
        model.compile(loss='mse', optimizer=tf_lossscale.LossScaleOptimizer(tf.keras.optimizers.get('rmsprop')))
        model.compile(optimizer=tf_lossscale.LossScaleOptimizer(opt))
        def build(optimizer):
            model.compile(optimizer if isinstance(optimizer, tf_lossscale.LossScaleOptimizer) else tf_lossscale.LossScaleOptimizer(tf.keras.optimizers.get(optimizer)))
        """),
    ("compile_sees_the_assignment_that_reaches_it", """\
        from tensorflow import keras

        keras.mixed_precision.set_global_policy('mixed_float16')
        optimizer = keras.optimizers.Adam()
        optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer)
        model.compile(optimizer, 'mse')
        """, """\
        from tensorflow import keras
        import tf_lossscale

        keras.mixed_precision.set_global_policy('mixed_float16')
        optimizer = keras.optimizers.Adam()
        optimizer = tf_lossscale.LossScaleOptimizer(optimizer)
        model.compile(optimizer, 'mse')
        """),
    ("compile_keeps_what_a_conditional_wrapper_may_have_wrapped", """\
        from tensorflow import keras

        keras.mixed_precision.set_global_policy('mixed_float16')
        optimizer = keras.optimizers.Adam()
        if amp:
            optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer)
        model.compile(optimizer=optimizer)
        """, """\
        from tensorflow import keras
        import tf_lossscale

        keras.mixed_precision.set_global_policy('mixed_float16')
        optimizer = keras.optimizers.Adam()
        if amp:
            optimizer = tf_lossscale.LossScaleOptimizer(optimizer)
        model.compile(optimizer=optimizer if isinstance(optimizer, tf_lossscale.LossScaleOptimizer) else tf_lossscale.LossScaleOptimizer(keras.optimizers.get(optimizer)))
        """),
    ("legacy_policy_loss_scale_moves_to_the_compiled_optimizer", """\
        import tensorflow as tf
        from tensorflow.keras.mixed_precision import experimental as mixed_precision

        policy = mixed_precision.Policy('mixed_float16', loss_scale=1024)
        mixed_precision.set_policy(policy)
        model.compile(optimizer='adam', loss='mse')
        """, """\
        import tensorflow as tf
        from tensorflow.keras import mixed_precision
        import tf_lossscale

        policy = mixed_precision.Policy('mixed_float16')
        mixed_precision.set_global_policy(policy)
        model.compile(optimizer=tf_lossscale.experimental.LossScaleOptimizer(tf.keras.optimizers.get('adam'), 1024), loss='mse')
        """),
    ("compile_without_a_loss_scaling_policy_is_left", """\
        import tensorflow as tf
        tf.keras.mixed_precision.set_global_policy('mixed_bfloat16')
        model.compile('sgd', 'mse')
        pattern = re.compile('x')
        """, """\
        import tensorflow as tf
        tf.keras.mixed_precision.set_global_policy('mixed_bfloat16')
        model.compile('sgd', 'mse')
        pattern = re.compile('x')
        """),
    # enable_/disable_mixed_precision_graph_rewrite.
    ("graph_rewrite_of_a_keras_optimizer", """\
        import tensorflow as tf

        opt = tf.keras.optimizers.SGD(0.1)
        opt = tf.train.experimental.enable_mixed_precision_graph_rewrite(
            opt, loss_scale=128)
        model.compile(optimizer=opt, loss='mse')
        opt.minimize(loss, var_list, tape=tape)
        tf.train.experimental.disable_mixed_precision_graph_rewrite()
        """, """\
        import tensorflow as tf
        import tf_lossscale

        opt = tf.keras.optimizers.SGD(0.1)
        tf.config.optimizer.set_experimental_options({'auto_mixed_precision': True})
        opt = tf_lossscale.LossScaleOptimizer(opt, dynamic=False, initial_scale=128)
        model.compile(optimizer=opt, loss='mse')
        opt.minimize(loss, var_list, tape=tape)
        tf.config.optimizer.set_experimental_options({'auto_mixed_precision': False})
        """),
    ("graph_rewrite_of_a_tf1_optimizer_imported_by_name", """\
        from tensorflow.compat.v1.mixed_precision import enable_mixed_precision_graph_rewrite
        import tensorflow.compat.v1 as tf

        opt = enable_mixed_precision_graph_rewrite(tf.train.AdamOptimizer())
        """, """\
        import tensorflow.compat.v1 as tf
        import tf_lossscale

        tf.config.optimizer.set_experimental_options({'auto_mixed_precision': True})
        opt = tf_lossscale.MixedPrecisionLossScaleOptimizer(tf.train.AdamOptimizer(), 'dynamic')
        """),
    ("graph_rewrite_without_a_tensorflow_alias_imports_tensorflow", """\
        from tensorflow.keras.optimizers import Adam
        from tensorflow.mixed_precision import experimental as mpe
        opt = mpe.enable_mixed_precision_graph_rewrite(opt=Adam(), loss_scale='dynamic')
        grads = opt.get_unscaled_gradients(grads)
        """, """\
        from tensorflow.keras.optimizers import Adam
        import tensorflow
        import tf_lossscale

        tensorflow.config.optimizer.set_experimental_options({'auto_mixed_precision': True})
        opt = tf_lossscale.LossScaleOptimizer(Adam())
        grads = opt.get_unscaled_gradients(grads)
        """),
    # TF 2.1-2.3's optimizer.loss_scale(), a LossScale object's call.
    ("loss_scale_call_on_a_loss_scale_optimizer_reads_the_scale", """\
        import tensorflow as tf
        opt = tf.keras.mixed_precision.experimental.LossScaleOptimizer(sgd, 'dynamic')
        a = opt.loss_scale()
        b = self.model.optimizer.loss_scale()
        grads = opt.get_unscaled_gradients(grads)
        """, """\
        import tensorflow as tf
        import tf_lossscale

        opt = tf_lossscale.LossScaleOptimizer(sgd)
        a = opt.loss_scale
        b = self.model.optimizer.loss_scale
        grads = opt.get_unscaled_gradients(grads)
        """),
]


@pytest.mark.parametrize("name,legacy,current", PAIRS,
                         ids=[p[0] for p in PAIRS])
def test_rewrites_legacy_source_to_current(name, legacy, current):
    assert _rewrite(legacy) == (_same(current), [])


def test_source_without_legacy_names_is_unchanged():
    source = _same("""\
        import tensorflow as tf  # a comment
        import keras
        opt = keras.mixed_precision.LossScaleOptimizer(sgd)
        x = tf.train.experimental.PythonState
        model.compile(opt, 'mse')
        """)
    assert migrate.rewrite(source) == (source, [])


@pytest.mark.parametrize("name,legacy,current", PAIRS,
                         ids=[p[0] for p in PAIRS])
def test_rewriting_twice_changes_nothing_more(name, legacy, current):
    once, _ = _rewrite(legacy)
    assert migrate.rewrite(once) == (once, [])


def test_loss_scale_in_a_variable_is_kept_working_and_reported():
    new, notes = _rewrite("""\
        import tensorflow as tf

        opt = tf.keras.mixed_precision.experimental.LossScaleOptimizer(sgd, ls)
        grads = opt.get_unscaled_gradients(grads)
        """)
    assert "tf_lossscale.experimental.LossScaleOptimizer(sgd, ls)" in new
    assert [n.line for n in notes] == [3]
    assert "loss_scale=ls" in notes[0].reason
    assert "by hand" in notes[0].reason


def test_multiplier_other_than_two_is_reported_with_the_table_reason():
    _, notes = _rewrite("""\
        import tensorflow as tf
        opt = tf.keras.mixed_precision.experimental.LossScaleOptimizer(
            sgd, tf.train.experimental.DynamicLossScale(multiplier=4))
        grads = opt.get_unscaled_gradients(grads)
        """)
    assert [n.line for n in notes] == [2]
    assert "multiplier=4 has no equivalent" in notes[0].reason


def test_loss_scale_below_one_is_reported_not_converted():
    new, notes = _rewrite("""\
        import tensorflow as tf
        opt = tf.keras.mixed_precision.experimental.LossScaleOptimizer(sgd, 0.5)
        grads = opt.get_unscaled_gradients(grads)
        """)
    assert "initial_scale" not in new
    assert "loss_scale must be" in notes[0].reason and "0.5" in notes[0].reason


def test_policy_with_a_non_default_loss_scale_is_left_and_reported():
    new, notes = _rewrite("""\
        from tensorflow.keras.mixed_precision import experimental as mp
        policy = mp.Policy('mixed_float16', loss_scale=128)
        """)
    assert "mp.Policy('mixed_float16', loss_scale=128)" in new
    assert notes[0].line == 2
    assert "takes no loss scale" in notes[0].reason


def test_member_without_current_equivalent_is_reported():
    _, notes = _rewrite("""\
        import tensorflow as tf
        policy = tf.keras.mixed_precision.experimental.get_layer_policy(layer)
        """)
    assert notes == [migrate.Note(2, (
        "tf.keras.mixed_precision.experimental.get_layer_policy has no "
        "current equivalent in the migration table; rewrite it by hand"))]


# What cannot be converted statically is named, line by line.

def _notes(source):
    new, notes = _rewrite(source)
    return [(n.line, n.reason) for n in notes]


def test_every_policy_loss_scale_read_is_reported():
    notes = _notes("""\
        from tensorflow.keras.mixed_precision import experimental as mp
        policy = mp.Policy('mixed_float16')
        mp.set_policy(policy)
        print('Loss scale: %s' % policy.loss_scale)
        print(mp.global_policy().loss_scale)
        print(model.dtype_policy.loss_scale)
        value = policy.loss_scale()
        """)
    assert [line for line, _ in notes] == [4, 5, 6, 7]
    assert notes[0][1] == (
        "policy.loss_scale is a dtype policy's loss scale, which the current "
        "Policy does not have: the loss scale is the optimizer's now (read "
        "optimizer.loss_scale, a tensor); rewrite this by hand")
    assert notes[1][1].startswith("mp.global_policy().loss_scale is a dtype")
    assert notes[3][1].startswith("policy.loss_scale() is a dtype")


def test_experimental_optimizer_loss_scale_object_uses_are_reported():
    new, notes = _rewrite("""\
        import tensorflow as tf
        opt = tf.keras.mixed_precision.experimental.LossScaleOptimizer(sgd, 'dynamic')
        print(opt.loss_scale)
        config = opt.loss_scale.get_config()
        now = opt.loss_scale()
        """)
    assert "now = opt.loss_scale\n" in new
    assert [n.line for n in notes] == [3, 4]
    assert notes[0].reason == (
        "opt.loss_scale was a LossScale object (callable, printed as "
        "DynamicLossScale(...)); it is the current scale, a float32 tensor, "
        "now; rewrite this use by hand")


def test_current_optimizer_loss_scale_reads_are_left_alone():
    assert _notes("""\
        import tensorflow as tf
        opt = tf.keras.mixed_precision.LossScaleOptimizer(sgd)
        tf.summary.scalar('loss_scale', opt.loss_scale)
        self.loss_scale = 3
        """) == []


def test_loss_scale_call_on_an_unknown_object_is_reported():
    assert _notes("""\
        def log(thing):
            print(thing.loss_scale())
        """) == [(2, "thing.loss_scale(): the rewriter cannot tell whether "
                  "thing is a LossScaleOptimizer (whose loss_scale is the "
                  "current scale, a tensor, now) or a LossScale; rewrite "
                  "this by hand")]


def test_graph_rewrite_it_cannot_place_or_type_is_reported():
    new, notes = _rewrite("""\
        import tensorflow as tf
        rewrite = tf.train.experimental.enable_mixed_precision_graph_rewrite
        opt = tf.train.experimental.enable_mixed_precision_graph_rewrite(make())
        if tf.train.experimental.enable_mixed_precision_graph_rewrite(
                tf.keras.optimizers.SGD()):
            pass
        """)
    assert [n.line for n in notes] == [2, 3, 4]
    assert notes[0].reason == (
        "tf.train.experimental.enable_mixed_precision_graph_rewrite is "
        "converted only where it is called; rewrite this use by hand")
    assert "cannot tell whether make() is a Keras optimizer" in (
        notes[1].reason)
    assert "not inside a simple statement" in notes[2].reason
    assert new.count("enable_mixed_precision_graph_rewrite") == 3


def test_compile_under_a_policy_it_cannot_read_is_reported():
    notes = _notes("""\
        import sys
        import tensorflow as tf
        tf.keras.mixed_precision.set_global_policy(sys.argv[1])
        model.compile('sgd', 'mse')
        model.compile(make_optimizer(), 'mse')
        """)
    assert [line for line, _ in notes] == [4, 5]
    assert "cannot tell which policy this compile runs under" in notes[0][1]


def test_compile_of_an_unknown_call_under_mixed_float16_is_reported():
    assert _notes("""\
        import tensorflow as tf
        tf.keras.mixed_precision.set_global_policy('mixed_float16')
        model.compile(make_optimizer(), 'mse')
        """) == [(3, "model.compile: the rewriter cannot tell whether "
                  "make_optimizer() is already a LossScaleOptimizer, which "
                  "compile kept, or an optimizer, which it wrapped: wrap it "
                  "in tf_lossscale.LossScaleOptimizer by hand if it is not "
                  "one; left unchanged")]


def test_policy_without_loss_scaling_on_mixed_float16_is_reported():
    notes = _notes("""\
        import tensorflow as tf
        mp = tf.keras.mixed_precision.experimental
        tf.keras.mixed_precision.experimental.set_policy(
            tf.keras.mixed_precision.experimental.Policy(
                'mixed_float16', loss_scale=None))
        model.compile('sgd', 'mse')
        """)
    assert [line for line, _ in notes] == [2, 4, 6]
    assert "auto_scale_loss=False" in notes[2][1]


# The rules restated from config_conversion agree with it.

@pytest.mark.parametrize("value", [
    "dynamic", 1, 1.0, 128, 2.0**15, 3.4028234663852886e38, 0.5, 0, -4,
    float("inf"), float("nan"), 1e39, True, None, "static", "Dynamic"])
def test_literal_loss_scale_rule_agrees_with_config_conversion(value):
    try:
        expected = config_conversion.from_legacy_loss_scale(value)
    except ValueError:
        with pytest.raises(ValueError):
            loss_scale_args.legacy_kind(value)
        return
    kind = loss_scale_args.legacy_kind(value)
    assert kind == ("dynamic" if expected["dynamic"] else "fixed")


@pytest.mark.parametrize("multiplier", [2, 2.0, 3, 1.5])
def test_multiplier_rule_agrees_with_config_conversion(multiplier):
    try:
        config_conversion.from_dynamic_loss_scale_args(multiplier=multiplier)
    except ValueError as e:
        with pytest.raises(ValueError) as ours:
            loss_scale_args.check_multiplier(multiplier)
        # The optimizer's error leads with TF 2.4's sentence; the reason
        # after it is the rewriter's, word for word.
        assert str(e).endswith(" " + str(ours.value))
        assert str(e).startswith("Cannot deserialize LossScaleOptimizer")
        return
    loss_scale_args.check_multiplier(multiplier)


NO_TENSORFLOW = """\
import sys, types
# tf_lossscale/__init__.py imports TensorFlow (the core); the rewriter must
# not, so load the package without running it.
package = types.ModuleType("tf_lossscale")
package.__path__ = [sys.argv[1]]
sys.modules["tf_lossscale"] = package
from tf_lossscale.compat import migrate
code = migrate.run([sys.argv[2]], write=False)
heavy = sorted(m for m in ("tensorflow", "keras", "tf_keras", "numpy")
               if m in sys.modules)
print(code, heavy)
"""


def test_the_rewriter_imports_no_tensorflow(tmp_path):
    path = tmp_path / "legacy.py"
    path.write_text(LEGACY_FILE)
    result = subprocess.run(
        [sys.executable, "-c", NO_TENSORFLOW,
         os.path.join(REPO, "tf_lossscale"), str(path)],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "0 []"


def _config(optimizer):
    config = optimizer.get_config()
    del config["name"]  # Keras numbers default names.
    return config


@pytest.mark.parametrize("legacy_loss_scale", [
    "'dynamic'", "123", "tf.train.experimental.FixedLossScale(128.)",
    "tf.train.experimental.DynamicLossScale(initial_loss_scale=2048, "
    "increment_period=500)",
])
def test_rewritten_optimizer_has_the_experimental_optimizers_config(
        legacy_loss_scale):
    legacy = ("opt = tf.keras.mixed_precision.experimental.LossScaleOptimizer("
              f"keras.optimizers.SGD(name='sgd'), {legacy_loss_scale})\n")
    current, notes = migrate.rewrite("import tensorflow as tf\n" + legacy)
    assert notes == []
    namespace = {"keras": keras, "tf_lossscale": tf_lossscale}
    exec(current.replace("import tensorflow as tf\n", ""), namespace)
    with pytest.warns(DeprecationWarning):
        expected = tf_lossscale.experimental.LossScaleOptimizer(
            keras.optimizers.SGD(name="sgd"), eval(legacy_loss_scale.replace(
                "tf.train.experimental.", "tf_lossscale.")))
    assert _config(namespace["opt"]) == _config(expected)


LEGACY_FILE = """\
import tensorflow as tf
ls = tf.train.experimental.DynamicLossScale()
"""
LEFT_FILE = """\
import tensorflow as tf
opt = tf.keras.mixed_precision.experimental.LossScaleOptimizer(sgd, ls)
grads = opt.get_unscaled_gradients(grads)
"""


def test_migrate_prints_a_unified_diff_and_leaves_the_file(tmp_path, capsys,
                                                           monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(LEGACY_FILE)
    assert cli.main(["migrate", "train.py"]) == 0
    assert capsys.readouterr().out == (
        "--- a/train.py\n+++ b/train.py\n@@ -1,2 +1,4 @@\n"
        " import tensorflow as tf\n"
        "-ls = tf.train.experimental.DynamicLossScale()\n"
        "+import tf_lossscale\n"
        "+\n"
        "+ls = tf_lossscale.DynamicLossScale()\n")
    assert (tmp_path / "train.py").read_text() == LEGACY_FILE


def test_migrate_write_rewrites_every_python_file_of_a_folder(tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    for path in (tmp_path / "pkg" / "a.py", tmp_path / "pkg" / "sub" / "b.py"):
        path.write_text(LEGACY_FILE)
    (tmp_path / "pkg" / "notes.txt").write_text(LEGACY_FILE)
    assert cli.main(["migrate", "--write", str(tmp_path / "pkg")]) == 0
    for path in (tmp_path / "pkg" / "a.py", tmp_path / "pkg" / "sub" / "b.py"):
        assert path.read_text() == (
            "import tensorflow as tf\nimport tf_lossscale\n\n"
            "ls = tf_lossscale.DynamicLossScale()\n")
    assert (tmp_path / "pkg" / "notes.txt").read_text() == LEGACY_FILE


def test_migrate_reports_what_it_left_as_file_line_reason_and_fails(
        tmp_path, capsys):
    path = tmp_path / "left.py"
    path.write_text(LEFT_FILE)
    assert cli.main(["migrate", "--write", str(path)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    # Line 4 of the file as written (an import was added above it).
    assert err[0].startswith(f"{path}:4: tf.keras.mixed_precision."
                             "experimental.LossScaleOptimizer: loss_scale=ls")
    assert err[0].endswith(" [line 2 before --write]")


def test_migrate_keeps_windows_newlines_and_the_encoding(tmp_path):
    path = tmp_path / "crlf.py"
    source = "# -*- coding: latin-1 -*-\r\n# caf\xe9\r\n" + LEGACY_FILE.replace(
        "\n", "\r\n")
    path.write_bytes(source.encode("latin-1"))
    assert cli.main(["migrate", "--write", str(path)]) == 0
    assert path.read_bytes().decode("latin-1") == (
        "# -*- coding: latin-1 -*-\r\n# caf\xe9\r\nimport tensorflow as tf\r\n"
        "import tf_lossscale\r\n\r\nls = tf_lossscale.DynamicLossScale()\r\n")


def test_migrate_reports_unparsable_file(tmp_path, capsys):
    path = tmp_path / "broken.py"
    path.write_text("ls = tf.train.experimental.DynamicLossScale(\n")
    # A file it cannot parse is one it cannot migrate: exit 2 (issue 33),
    # with Python's own message and line.
    assert cli.main(["migrate", str(path)]) == 2
    assert capsys.readouterr().err.startswith(
        f"{path}:1: cannot parse: '(' was never closed\n")


def test_migrate_missing_path_exits_2(tmp_path, capsys):
    assert cli.main(["migrate", str(tmp_path / "nope.py")]) == 2
    assert "nope.py: no such file or folder" in capsys.readouterr().err


def test_compile_of_a_model_whose_class_overrides_compile_is_reported():
    legacy = """\
        import tensorflow as tf
        from tensorflow.keras import mixed_precision as mxp

        class Base(tf.keras.Model):
            def compile(self, optimizer, **kwargs):
                optimizer = mxp.experimental.LossScaleOptimizer(
                    tf.keras.optimizers.get(optimizer), 'dynamic')
                super().compile(optimizer=optimizer, **kwargs)

        mxp.set_global_policy('mixed_float16')
        model = Base()
        model.compile(optimizer='adam', loss='mse')
        """
    text, notes = _rewrite(legacy)
    # Its own compile wraps the optimizer: wrapping it here as well would
    # make it wrap a LossScaleOptimizer (a TypeError).
    assert "model.compile(optimizer='adam', loss='mse')" in text
    assert "super().compile(optimizer=optimizer, **kwargs)" in text
    # No scaling call is seen on it: TF 2.4's class, which takes gradients
    # as the legacy one did.
    assert "tf_lossscale.experimental.LossScaleOptimizer(\n" in text
    assert [n.line for n in notes] == [12]
    assert "defines its own compile (class Base)" in notes[0].reason
