"""The migration shim: install()/uninstall() and the TF 2.1-2.3 policy API."""

import os
import subprocess
import sys
import textwrap

import keras
import pytest
import tensorflow as tf

import tf_lossscale
from tf_lossscale import compat
from tf_lossscale.compat import legacy_names
from tf_lossscale.compat import __main__ as runner

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def shim():
    """The shim installed for one test, and the float32 policy after it."""
    compat.install()
    try:
        yield
    finally:
        compat.uninstall()
        keras.config.set_dtype_policy("float32")


@pytest.fixture
def float32_afterwards():
    yield
    keras.config.set_dtype_policy("float32")


def _lookup(dotted):
    """`tf.x.y` by attribute access, as a script spells it."""
    obj = tf
    for attr in dotted.split(".")[1:]:
        obj = getattr(obj, attr)
    return obj


def _shim_object(dotted):
    module, _, name = dotted.rpartition(".")
    return getattr(sys.modules[module], name)


def _namespaces():
    """Every legacy namespace and the names it holds today."""
    found = {}
    for legacy in legacy_names.LEGACY_NAMES:
        namespace = legacy.rpartition(".")[0]
        try:
            found[namespace] = sorted(dir(_lookup(namespace)))
        except AttributeError:
            found[namespace] = None
    return found


@pytest.mark.parametrize("legacy", sorted(legacy_names.LEGACY_NAMES))
def test_install_binds_the_legacy_name_to_its_shim_object(shim, legacy):
    shim_name = legacy_names.LEGACY_NAMES[legacy].shim
    assert _lookup(legacy) is _shim_object(shim_name)


def test_legacy_names_are_gone_without_the_shim():
    with pytest.raises(AttributeError):
        _lookup("tensorflow.keras.mixed_precision.experimental")
    with pytest.raises(AttributeError):
        _lookup("tensorflow.train.experimental.DynamicLossScale")


def test_uninstall_restores_every_namespace_exactly():
    before = _namespaces()
    v1_class = tf.compat.v1.mixed_precision.DynamicLossScale
    meta_path, modules = list(sys.meta_path), set(sys.modules)
    compat.install()
    compat.uninstall()
    assert _namespaces() == before
    assert tf.compat.v1.mixed_precision.DynamicLossScale is v1_class
    assert "compile" not in vars(keras.Model)
    assert sys.meta_path == meta_path
    assert set(sys.modules) == modules


def test_install_twice_then_uninstall_once_restores_everything():
    before = _namespaces()
    compat.install()
    compat.install()
    assert compat.installed()
    compat.uninstall()
    assert not compat.installed()
    assert _namespaces() == before
    compat.uninstall()  # Not installed: nothing to do.
    assert _namespaces() == before


def test_import_statements_of_legacy_modules_work_after_install():
    script = textwrap.dedent("""\
        import tf_lossscale, tf_lossscale.compat
        tf_lossscale.compat.install()
        import tensorflow.keras.mixed_precision.experimental as a
        from tensorflow.keras.mixed_precision import experimental as b
        import tensorflow.keras.mixed_precision as c
        from tensorflow.train.experimental import DynamicLossScale
        from tensorflow.mixed_precision.experimental import FixedLossScale
        import tensorflow as tf
        assert a is b is c.experimental is tf.keras.mixed_precision.experimental
        experimental = tf_lossscale.experimental
        assert a.LossScaleOptimizer is experimental.LossScaleOptimizer
        assert a.Policy is tf_lossscale.compat.Policy
        assert DynamicLossScale is tf_lossscale.DynamicLossScale
        assert FixedLossScale is tf_lossscale.FixedLossScale
        tf_lossscale.compat.uninstall()
        assert not hasattr(c, "experimental")
        assert not hasattr(tf.train.experimental, "DynamicLossScale")
        print("ok")
        """)
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ok\n"


# The TF 2.1-2.3 policy API.

def test_mixed_float16_policy_defaults_to_dynamic_loss_scaling():
    policy = compat.Policy("mixed_float16")
    assert (policy.compute_dtype, policy.variable_dtype) == ("float16",
                                                             "float32")
    assert isinstance(policy.loss_scale, tf_lossscale.DynamicLossScale)
    assert policy.loss_scale.get_config() == {
        "initial_loss_scale": 2.0**15, "increment_period": 2000,
        "multiplier": 2.0}
    assert policy.should_cast_variables


def test_float32_policy_defaults_to_no_loss_scale():
    policy = compat.Policy("float32")
    assert policy.loss_scale is None
    assert not policy.should_cast_variables


@pytest.mark.parametrize("loss_scale,expected", [
    (128, tf_lossscale.FixedLossScale(128)),
    ("dynamic", tf_lossscale.DynamicLossScale()),
    (None, None),
    ({"class_name": "FixedLossScale", "config": {"loss_scale_value": 4.0}},
     tf_lossscale.FixedLossScale(4)),
], ids=["number", "dynamic", "none", "serialized"])
def test_policy_takes_each_loss_scale_form(loss_scale, expected):
    loss_scale = compat.Policy("mixed_float16", loss_scale).loss_scale
    assert type(loss_scale) is type(expected)
    if expected is not None:
        assert loss_scale.get_config() == expected.get_config()


def test_policy_keeps_a_loss_scale_instance():
    loss_scale = tf_lossscale.DynamicLossScale(64, 10)
    assert compat.Policy("float32", loss_scale=loss_scale).loss_scale is (
        loss_scale)


def test_policy_rejects_a_bad_loss_scale_naming_it():
    with pytest.raises(ValueError, match=r"'huge'"):
        compat.Policy("mixed_float16", loss_scale="huge")


def test_policy_config_round_trips_a_non_default_loss_scale():
    policy = compat.Policy("mixed_float16", loss_scale=256)
    config = policy.get_config()
    assert config == {"name": "mixed_float16", "loss_scale": {
        "class_name": "FixedLossScale", "config": {"loss_scale_value": 256.0}}}
    restored = compat.Policy.from_config(config)
    assert restored.loss_scale.get_config() == {"loss_scale_value": 256.0}
    assert compat.Policy("float32").get_config() == {"name": "float32"}


def test_set_policy_by_name_sets_a_legacy_global_policy(float32_afterwards):
    compat.set_policy("mixed_float16")
    policy = compat.global_policy()
    assert isinstance(policy, compat.Policy)
    assert keras.config.dtype_policy() is policy
    assert isinstance(policy.loss_scale, tf_lossscale.DynamicLossScale)
    assert keras.layers.Dense(2).dtype_policy is policy


def test_set_policy_none_restores_the_float32_policy(float32_afterwards):
    compat.set_policy("mixed_float16")
    compat.set_policy(None)
    assert keras.config.dtype_policy().name == "float32"


def test_set_policy_rejects_what_is_not_a_policy(float32_afterwards):
    with pytest.raises(ValueError, match=r"got 3 of type int"):
        compat.set_policy(3)
    assert keras.config.dtype_policy().name == "float32"


def test_global_policy_wraps_a_policy_set_through_keras(float32_afterwards):
    keras.config.set_dtype_policy("mixed_float16")
    policy = compat.global_policy()
    assert isinstance(policy, compat.Policy)
    assert policy.name == "mixed_float16"
    assert isinstance(policy.loss_scale, tf_lossscale.DynamicLossScale)


def _compiled(optimizer="sgd"):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=optimizer, loss="mse")
    return model


def test_compile_under_a_policy_wraps_with_its_loss_scale(shim):
    compat.set_policy(compat.Policy("mixed_float16", loss_scale=123))
    optimizer = _compiled().optimizer
    assert isinstance(optimizer, tf_lossscale.experimental.LossScaleOptimizer)
    assert not optimizer.dynamic
    assert optimizer.initial_scale == 123.0
    assert isinstance(optimizer.inner_optimizer, keras.optimizers.SGD)


def test_compile_under_default_mixed_policy_scales_dynamically(shim):
    compat.set_policy("mixed_float16")
    optimizer = _compiled(keras.optimizers.Adam()).optimizer
    assert isinstance(optimizer, tf_lossscale.experimental.LossScaleOptimizer)
    assert optimizer.dynamic
    assert (optimizer.initial_scale, optimizer.dynamic_growth_steps) == (
        2.0**15, 2000)


def test_compile_under_a_policy_without_loss_scale_does_not_wrap(shim):
    compat.set_policy(compat.Policy("mixed_float16", loss_scale=None))
    assert type(_compiled().optimizer) is keras.optimizers.SGD


def test_compile_keeps_a_loss_scale_optimizer_it_is_given(shim):
    compat.set_policy(compat.Policy("mixed_float16", loss_scale=8))
    given = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD())
    assert _compiled(given).optimizer is given


def test_compile_without_the_shim_uses_keras_own_wrapper(float32_afterwards):
    compat.set_policy(compat.Policy("mixed_float16", loss_scale=123))
    optimizer = _compiled().optimizer
    assert not isinstance(optimizer, tf_lossscale.LossScaleOptimizer)
    assert isinstance(optimizer, keras.mixed_precision.LossScaleOptimizer)


# The runner, in-process where it does not run a script.

def test_runner_without_a_script_prints_usage_and_exits_2(capsys):
    assert runner.main([]) == 2
    assert capsys.readouterr().err.startswith("usage: python -m "
                                              "tf_lossscale.compat SCRIPT")


def test_runner_with_a_missing_script_exits_2_as_python_does(capsys,
                                                              tmp_path):
    assert runner.main([str(tmp_path / "nope.py")]) == 2
    assert "can't open file" in capsys.readouterr().err
    assert not compat.installed()


PROBE = """\
import sys
print(sys.argv, __name__, __file__, sys.path[0])
sys.exit(int(sys.argv[2]))
"""
FAILING = """\
def train():
    raise {}

train()
"""


def _tf_log(line):
    return ("oneDNN" in line or "cuda" in line or "absl" in line
            or line.startswith("WARNING: All log messages"))


def _run(args, cwd):
    result = subprocess.run([sys.executable, *args], cwd=cwd, text=True,
                            capture_output=True, timeout=300,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    stderr = "".join(line for line in result.stderr.splitlines(True)
                     if not _tf_log(line))
    return result.returncode, result.stdout, stderr


def test_runner_gives_the_script_its_argv_name_and_exit_code(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "probe.py").write_text(PROBE)
    args = ["sub/probe.py", "--flag", "3"]
    direct = _run(args, tmp_path)
    assert direct[0] == 3
    assert _run(["-m", "tf_lossscale.compat", *args], tmp_path) == direct


@pytest.mark.parametrize("error,exit_code", [
    ('ValueError("the loss went to NaN")', 1),
    ("KeyboardInterrupt", -2),  # Python dies of SIGINT.
], ids=["error", "interrupt"])
def test_runner_prints_the_traceback_python_would(tmp_path, error,
                                                  exit_code):
    (tmp_path / "failing.py").write_text(FAILING.format(error))
    direct = _run(["failing.py"], tmp_path)
    assert direct[0] == exit_code and direct[2].startswith("Traceback")
    assert _run(["-m", "tf_lossscale.compat", "failing.py"], tmp_path) == (
        direct)


def test_compat_public_names_are_the_documented_list():
    assert sorted(compat.__all__) == [
        "Policy", "global_policy", "install", "installed", "set_policy",
        "uninstall"]


def test_set_policy_refuses_keras_3_policy_when_tf_keras_is_tf_keras():
    script = textwrap.dedent("""\
        import tensorflow as tf
        import tf_keras
        import tf_lossscale
        from tf_lossscale import compat
        compat.install()
        mp = tf.keras.mixed_precision.experimental
        opt = mp.LossScaleOptimizer(tf.keras.optimizers.SGD(), loss_scale=8)
        assert isinstance(opt.inner_optimizer, tf_keras.optimizers.SGD)
        assert isinstance(opt, tf_lossscale.LossScaleOptimizer)
        try:
            mp.set_policy("mixed_float16")
        except RuntimeError as e:
            print(e)
        """)
    result = subprocess.run(
        [sys.executable, "-W", "ignore::DeprecationWarning", "-c", script],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "TF_USE_LEGACY_KERAS": "1"})
    assert result.returncode == 0, result.stderr
    assert "tf.keras is tf_keras here (TF_USE_LEGACY_KERAS=1)" in result.stdout
