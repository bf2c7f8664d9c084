"""The `migrate` rewriter: legacy source in, current source out."""

import textwrap

import keras
import pytest

import tf_lossscale
from tf_lossscale import cli
from tf_lossscale.compat import migrate


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
        """, """\
        import tensorflow as tf
        import tf_lossscale

        opt = tf_lossscale.LossScaleOptimizer(
            tf.keras.optimizers.SGD())
        """),
    ("number_becomes_a_fixed_initial_scale", """\
        import tensorflow as tf
        opt = tf.keras.mixed_precision.experimental.LossScaleOptimizer(
            tf.keras.optimizers.SGD(), loss_scale=123)
        """, """\
        import tensorflow as tf
        import tf_lossscale

        opt = tf_lossscale.LossScaleOptimizer(
            tf.keras.optimizers.SGD(), dynamic=False, initial_scale=123)
        """),
    ("dynamic_loss_scale_args_are_renamed", """\
        import tensorflow as tf
        loss_scale = tf.compat.v1.mixed_precision.experimental.DynamicLossScale
        opt = tf.keras.mixed_precision.experimental.LossScaleOptimizer(
            tf.keras.optimizers.SGD(),
            loss_scale=tf.train.experimental.DynamicLossScale(
                initial_loss_scale=2048, increment_period=500))
        """, """\
        import tensorflow as tf
        import tf_lossscale

        loss_scale = tf_lossscale.DynamicLossScale
        opt = tf_lossscale.LossScaleOptimizer(
            tf.keras.optimizers.SGD(),
            initial_scale=2048,
            dynamic_growth_steps=500)
        """),
    ("positional_fixed_loss_scale_and_optimizer_keyword", """\
        import tensorflow as tf
        opt = tf.keras.mixed_precision.experimental.LossScaleOptimizer(
            optimizer=sgd, loss_scale=tf.train.experimental.FixedLossScale(2 ** 7))
        """, """\
        import tensorflow as tf
        import tf_lossscale

        opt = tf_lossscale.LossScaleOptimizer(
            inner_optimizer=sgd, dynamic=False, initial_scale=2 ** 7)
        """),
    ("aliased_module_import_and_policy_api", """\
        from tensorflow.keras.mixed_precision import experimental as mixed_precision  # TF 2.3

        # Mixed precision, as the guide says.
        policy = mixed_precision.Policy('mixed_float16')
        mixed_precision.set_policy(policy)
        print(mixed_precision.global_policy())
        opt = mixed_precision.LossScaleOptimizer(sgd, 'dynamic')
        """, """\
        from tensorflow.keras import mixed_precision  # TF 2.3
        import tf_lossscale

        # Mixed precision, as the guide says.
        policy = mixed_precision.Policy('mixed_float16')
        mixed_precision.set_global_policy(policy)
        print(mixed_precision.global_policy())
        opt = tf_lossscale.LossScaleOptimizer(sgd)
        """),
    ("member_imports_move_to_their_new_modules", """\
        from tensorflow.keras.mixed_precision.experimental import (
            LossScaleOptimizer, set_policy, Policy as P)
        set_policy(P('mixed_float16', loss_scale='auto'))
        opt = LossScaleOptimizer(sgd, loss_scale=8)
        """, """\
        from tf_lossscale import LossScaleOptimizer
        from tensorflow.keras.mixed_precision import set_global_policy, Policy as P
        set_global_policy(P('mixed_float16'))
        opt = LossScaleOptimizer(sgd, dynamic=False, initial_scale=8)
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
            DynamicLossScale, enable_mixed_precision_graph_rewrite)
        ls = DynamicLossScale()
        """, """\
        from tensorflow.compat.v1.mixed_precision import (
            enable_mixed_precision_graph_rewrite)
        from tf_lossscale import DynamicLossScale
        ls = DynamicLossScale()
        """),
]


@pytest.mark.parametrize("name,legacy,current", PAIRS,
                         ids=[p[0] for p in PAIRS])
def test_rewrites_legacy_source_to_current(name, legacy, current):
    assert _rewrite(legacy) == (_same(current), [])


def test_source_without_legacy_names_is_unchanged():
    source = _same("""\
        import tensorflow as tf  # a comment
        opt = tf.keras.mixed_precision.LossScaleOptimizer(sgd)
        x = tf.train.experimental.PythonState
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
        """)
    assert [n.line for n in notes] == [2]
    assert "multiplier=4 has no equivalent" in notes[0].reason


def test_loss_scale_below_one_is_reported_not_converted():
    new, notes = _rewrite("""\
        import tensorflow as tf
        opt = tf.keras.mixed_precision.experimental.LossScaleOptimizer(sgd, 0.5)
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
    assert err[0].startswith(f"{path}:2: tf.keras.mixed_precision."
                             "experimental.LossScaleOptimizer: loss_scale=ls")


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
    path.write_text("x = (\n")
    assert cli.main(["migrate", str(path)]) == 1
    assert capsys.readouterr().err.startswith(f"{path}:")


def test_migrate_missing_path_exits_2(tmp_path, capsys):
    assert cli.main(["migrate", str(tmp_path / "nope.py")]) == 2
    assert "nope.py: no such file or folder" in capsys.readouterr().err
