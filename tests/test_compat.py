"""The migration shim: install()/uninstall() and the TF 2.1-2.3 policy API."""

import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_lossscale
from tf_lossscale import compat
from tf_lossscale.compat import __main__ as runner
from tf_lossscale.compat import legacy_names

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
    v1_rewrite = tf.compat.v1.mixed_precision.enable_mixed_precision_graph_rewrite
    mixed_precision = tf.keras.mixed_precision
    meta_path, modules = list(sys.meta_path), set(sys.modules)
    compat.install()
    compat.uninstall()
    assert _namespaces() == before
    assert tf.compat.v1.mixed_precision.DynamicLossScale is v1_class
    assert (tf.compat.v1.mixed_precision.enable_mixed_precision_graph_rewrite
            is v1_rewrite)
    assert tf.keras.mixed_precision is mixed_precision is keras.mixed_precision
    assert "compile" not in vars(keras.Model)
    assert "loss_scale" not in vars(tf_lossscale.experimental.LossScaleOptimizer)
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
        from tf_lossscale.compat import legacy_optimizer
        assert a.LossScaleOptimizer is (
            legacy_optimizer.ExperimentalLossScaleOptimizer)
        assert issubclass(a.LossScaleOptimizer,
                          tf_lossscale.experimental.LossScaleOptimizer)
        assert issubclass(a.LossScaleOptimizer, c.LossScaleOptimizer)
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


# TF 2.4-2.15: tf.keras.mixed_precision.LossScaleOptimizer is ours.

def test_tf_keras_name_is_ours_and_plain_keras_keeps_its_own(shim):
    # TF 2.4-2.15's class: ours, with that version's rule for unmarked
    # gradients (tests/test_subclasses_and_legacy_class.py).
    from tf_lossscale.compat import legacy_optimizer
    legacy = legacy_optimizer.LossScaleOptimizer
    assert tf.keras.mixed_precision.LossScaleOptimizer is legacy
    assert issubclass(legacy, tf_lossscale.LossScaleOptimizer)
    from tensorflow.keras import mixed_precision
    assert mixed_precision.LossScaleOptimizer is legacy
    assert keras.mixed_precision.LossScaleOptimizer.__module__.startswith(
        "keras.")
    assert tf.keras.mixed_precision.Policy is keras.mixed_precision.Policy


def test_tf_2_4_optimizer_api_works_under_the_shim(shim):
    opt = tf.keras.mixed_precision.LossScaleOptimizer(
        tf.keras.optimizers.SGD(1.0), dynamic=False, initial_scale=128)
    var = tf.Variable([2.0])
    with tf.GradientTape() as tape:
        loss = opt.get_scaled_loss(tf.reduce_sum(var * var))
    grads = opt.get_unscaled_gradients(tape.gradient(loss, [var]))
    opt.apply_gradients(zip(grads, [var]))
    assert float(loss) == 512.0
    assert var.numpy().tolist() == [-2.0]
    assert float(opt.loss_scale) == 128.0 and opt.dynamic_counter is None
    assert isinstance(opt, tf.keras.mixed_precision.LossScaleOptimizer)


def test_tf_2_4_name_with_a_legacy_loss_scale_keyword_says_why(shim):
    # No TF version took loss_scale= on this name; `migrate` converts it.
    with pytest.raises(ValueError, match="`loss_scale`"):
        tf.keras.mixed_precision.LossScaleOptimizer(
            tf.keras.optimizers.SGD(), loss_scale="dynamic")
    with pytest.raises(TypeError, match=r"experimental\.LossScaleOptimizer"):
        tf.keras.mixed_precision.LossScaleOptimizer(
            tf.keras.optimizers.SGD(), "dynamic")


def test_compile_under_mixed_float16_wraps_in_ours(shim):
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    optimizer = _compiled("adam").optimizer
    assert isinstance(optimizer, tf.keras.mixed_precision.LossScaleOptimizer)
    assert not isinstance(optimizer,
                          tf_lossscale.experimental.LossScaleOptimizer)
    assert (optimizer.dynamic, optimizer.initial_scale,
            optimizer.dynamic_growth_steps) == (True, 2.0**15, 2000)
    assert isinstance(optimizer.inner_optimizer, keras.optimizers.Adam)
    assert float(optimizer.get_scaled_loss(tf.constant(2.0))) == 65536.0


def test_compile_with_auto_scale_loss_false_or_float32_does_not_wrap(shim):
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", auto_scale_loss=False)
    assert type(model.optimizer) is keras.optimizers.SGD
    tf.keras.mixed_precision.set_global_policy("float32")
    assert type(_compiled().optimizer) is keras.optimizers.SGD


def test_fit_under_mixed_float16_trains_and_lowers_the_scale(shim):
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8),
                              keras.layers.Dense(1, dtype="float32")])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    x = np.full((32, 4), 1000.0, "float32")  # float16 gradients overflow.
    model.fit(x, np.ones((32, 1), "float32"), batch_size=32, epochs=3,
              verbose=0)
    assert float(model.optimizer.loss_scale) == 2.0**12
    assert int(model.optimizer.iterations) == 3


# TF 2.1-2.3's experimental optimizer: loss_scale is a LossScale object.

def _experimental(loss_scale):
    with pytest.warns(DeprecationWarning):
        return tf.keras.mixed_precision.experimental.LossScaleOptimizer(
            tf.keras.optimizers.SGD(1.0), loss_scale)


def test_experimental_loss_scale_is_callable_and_prints_as_tf_did(shim):
    opt = _experimental("dynamic")
    scale = opt.loss_scale()
    assert isinstance(scale, tf.Tensor) and float(scale) == 2.0**15
    assert repr(opt.loss_scale) == (
        "DynamicLossScale(current_loss_scale=32768.0, num_good_steps=0, "
        "initial_loss_scale=32768.0, increment_period=2000, multiplier=2.0)")
    assert opt.loss_scale.get_config() == {
        "initial_loss_scale": 32768.0, "increment_period": 2000,
        "multiplier": 2.0}
    fixed = _experimental(128)
    assert str(fixed.loss_scale) == "FixedLossScale(128.0)"
    assert fixed.loss_scale.get_config() == {"loss_scale_value": 128.0}


def test_experimental_loss_scale_reads_live_inside_tf_function(shim):
    opt = _experimental(tf_lossscale.DynamicLossScale(4.0, 1))
    var = tf.Variable(1.0)

    @tf.function
    def step(grad):
        opt.apply_gradients([(grad, var)])
        return opt.loss_scale(), tf.cast(opt.loss_scale, tf.float16)

    assert [float(v) for v in step(tf.constant(1.0))] == [8.0, 8.0]
    assert [float(v) for v in step(tf.constant(np.inf))] == [4.0, 4.0]
    # 1 - 1, the gradient applied as given (unscaled), as TF 2.4's class
    # applied it; the inf step changed nothing.
    assert float(var) == 0.0
    assert "current_loss_scale=4.0, num_good_steps=0" in repr(opt.loss_scale)


def test_experimental_loss_scale_has_tf_private_variable_names(shim):
    # TF 2.3 code read `optimizer.loss_scale._current_loss_scale`.
    opt = _experimental(tf_lossscale.DynamicLossScale(4.0, 3))
    var = tf.Variable(1.0)
    opt.apply_gradients([(tf.constant(4.0), var)])
    assert (float(opt.loss_scale._current_loss_scale),
            int(opt.loss_scale._num_good_steps)) == (4.0, 1)
    opt.loss_scale._current_loss_scale.assign(16.0)
    assert float(opt.loss_scale()) == 16.0
    with pytest.raises(AttributeError, match="FixedLossScale.*no attribute"):
        _ = _experimental(8).loss_scale._current_loss_scale


def test_experimental_loss_scale_is_a_tensor_again_after_uninstall():
    compat.install()
    opt = _experimental(8)
    compat.uninstall()
    assert isinstance(opt.loss_scale, tf.Tensor)


# enable_mixed_precision_graph_rewrite, every spelling.

REWRITE_SPELLINGS = ["tensorflow.train.experimental",
                     "tensorflow.compat.v1.train.experimental",
                     "tensorflow.compat.v1.mixed_precision"]


@pytest.fixture
def rewrite_off():
    yield
    tf.config.optimizer.set_experimental_options(
        {"auto_mixed_precision": False})
    from tensorflow.python.training.experimental import (
        mixed_precision_global_state,
    )
    mixed_precision_global_state.set_mixed_precision_graph_rewrite_enabled(
        False)


def _amp():
    return tf.config.optimizer.get_experimental_options().get(
        "auto_mixed_precision")


@pytest.mark.parametrize("namespace", REWRITE_SPELLINGS)
def test_graph_rewrite_wraps_a_keras_optimizer_as_tf_did(shim, rewrite_off,
                                                         namespace):
    enable = _lookup(f"{namespace}.enable_mixed_precision_graph_rewrite")
    disable = _lookup(f"{namespace}.disable_mixed_precision_graph_rewrite")
    inner = keras.optimizers.SGD()
    opt = enable(inner, loss_scale=64)
    assert isinstance(opt, tf_lossscale.experimental.LossScaleOptimizer)
    assert isinstance(opt, keras.optimizers.Optimizer)  # Keras 3's flavour.
    assert opt.inner_optimizer is inner
    assert (opt.dynamic, opt.initial_scale) == (False, 64.0)
    assert _amp() is True
    disable()
    assert _amp() is False


def test_graph_rewrite_wraps_a_tf1_optimizer_and_flags_sessions(shim,
                                                                 rewrite_off):
    from tensorflow.python.training.experimental import (
        mixed_precision_global_state as state,
    )
    opt = tf.train.experimental.enable_mixed_precision_graph_rewrite(
        tf.compat.v1.train.GradientDescentOptimizer(0.1))
    assert type(opt) is tf_lossscale.MixedPrecisionLossScaleOptimizer
    assert state.is_mixed_precision_graph_rewrite_enabled()
    tf.train.experimental.disable_mixed_precision_graph_rewrite()
    assert not state.is_mixed_precision_graph_rewrite_enabled()


@pytest.mark.parametrize("opt,message", [
    (lambda: tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD()),
     "must not already be a loss-scale optimizer"),
    (lambda: "sgd", "must be an instance of a tf.compat.v1.train.Optimizer "
     "or of a Keras optimizer, but got 'sgd'"),
], ids=["wrapped", "string"])
def test_graph_rewrite_refuses_what_tf_refused(shim, rewrite_off, opt,
                                                message):
    with pytest.raises(ValueError, match=message):
        tf.train.experimental.enable_mixed_precision_graph_rewrite(opt())
    assert not _amp()


def test_graph_rewrite_refuses_a_mixed_policy(shim, rewrite_off):
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    with pytest.raises(ValueError, match="'mixed_float16'"):
        tf.train.experimental.enable_mixed_precision_graph_rewrite(
            keras.optimizers.SGD())


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
        "LossScaleOptimizer", "Policy", "global_policy", "install",
        "installed", "set_policy", "uninstall"]


# With TF_USE_LEGACY_KERAS=1, in a process of its own.

TF_KERAS_SCRIPT = """\
import numpy as np
import tf_keras
import tf_lossscale
from tf_lossscale import compat
compat.install()
import tensorflow as tf
from tensorflow.keras.mixed_precision import experimental as mixed_precision


def model():
    return tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(8),
                                tf.keras.layers.Dense(1, dtype="float32")])


# The module-import spelling sets tf_keras' policy, which its layers read.
mixed_precision.set_policy("mixed_float16")
assert tf.keras.mixed_precision.experimental is mixed_precision
policy = tf_keras.mixed_precision.global_policy()
assert policy is mixed_precision.global_policy()
print("policy", type(policy).__module__, repr(policy))
m = model()
print("compute", m.layers[0].compute_dtype)
m.compile(optimizer=tf.keras.optimizers.SGD(0.01), loss="mse")
opt = m.optimizer
assert isinstance(opt, tf.keras.mixed_precision.experimental.LossScaleOptimizer)
assert isinstance(opt, tf_keras.optimizers.Optimizer)
print("compiled", opt.loss_scale)
m.fit(np.full((8, 4), 0.01), np.zeros((8, 1)), epochs=1, verbose=0)
print("after fit", float(opt.loss_scale()), int(opt.iterations))

# A fixed scale on the policy; the attribute spelling.
tf.keras.mixed_precision.experimental.set_policy(
    tf.keras.mixed_precision.experimental.Policy("mixed_float16",
                                                 loss_scale=256))
m = model()
m.compile(optimizer="sgd", loss="mse")
print("fixed", m.optimizer.loss_scale,
      tf.keras.mixed_precision.experimental.global_policy().loss_scale)

# TF 2.4-2.15: the non-experimental names.
tf.keras.mixed_precision.set_global_policy("mixed_float16")
m = model()
m.compile(optimizer="adam", loss="mse")
assert isinstance(m.optimizer, tf.keras.mixed_precision.LossScaleOptimizer)
assert isinstance(m.optimizer, tf_lossscale.LossScaleOptimizer)
assert not isinstance(m.optimizer, tf_lossscale.experimental.LossScaleOptimizer)
print("tf 2.4 compile", type(m.optimizer.inner_optimizer).__module__)
# TF 2.11-2.15's legacy optimizers: the same, in ours.
m = model()
m.compile(optimizer=tf.keras.optimizers.legacy.Adam(), loss="mse")
assert isinstance(m.optimizer, tf.keras.mixed_precision.LossScaleOptimizer)
m.fit(np.full((8, 4), 0.01), np.zeros((8, 1)), epochs=1, verbose=0)
print("legacy family", float(m.optimizer.get_scaled_loss(tf.constant(1.0))),
      int(m.optimizer.iterations))
tf.keras.mixed_precision.set_global_policy("float32")
opt = tf.train.experimental.enable_mixed_precision_graph_rewrite(
    tf.keras.optimizers.SGD(0.1), loss_scale="dynamic")
assert isinstance(opt, tf_lossscale.experimental.LossScaleOptimizer)
assert isinstance(opt.inner_optimizer, tf_keras.optimizers.SGD)
print("rewrite",
      tf.config.optimizer.get_experimental_options()["auto_mixed_precision"])
try:
    compat.set_policy("mixed_float16")
except RuntimeError as e:
    print("keras 3 set_policy:", e)
compat.uninstall()
print("uninstalled", tf.keras.mixed_precision.LossScaleOptimizer is (
    tf_keras.mixed_precision.LossScaleOptimizer))
"""


def test_tf_keras_flavour_of_every_spelling():
    result = subprocess.run(
        [sys.executable, "-W", "ignore::DeprecationWarning", "-c",
         TF_KERAS_SCRIPT],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "TF_USE_LEGACY_KERAS": "1",
             "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(
        "policy tf_lossscale.compat.tf_keras_policy <Policy \"mixed_float16\","
        " loss_scale=DynamicLossScale(current_loss_scale=32768.0, ")
    assert lines[1] == "compute float16"
    assert lines[2] == (
        "compiled DynamicLossScale(current_loss_scale=32768.0, num_good_steps="
        "0, initial_loss_scale=32768.0, increment_period=2000, multiplier=2.0)")
    assert lines[3] == "after fit 32768.0 1"
    assert lines[4] == "fixed FixedLossScale(256.0) FixedLossScale(256.0)"
    assert lines[5] == "tf 2.4 compile tf_keras.src.optimizers.adam"
    assert lines[6] == "legacy family 32768.0 1"
    assert lines[7] == "rewrite True"
    assert lines[8].startswith("keras 3 set_policy: tf_lossscale.compat."
                               "set_policy sets the Keras 3 policy")
    assert lines[9] == "uninstalled True"


def test_compile_hook_keeps_keras_own_compile_for_its_override_check(
        shim, tmp_path):
    # Keras 3 loads a model compiled only if `cls.compile is Trainer.compile`
    # (else it warns that compile is custom and leaves it uncompiled).
    from keras.src.trainers.trainer import Trainer
    assert keras.Model.compile is Trainer.compile
    keras.mixed_precision.set_global_policy("mixed_float16")
    model = keras.Sequential([keras.Input((3,)),
                              keras.layers.Dense(1, dtype="float32")])
    model.compile(optimizer="sgd", loss="mse")
    model.fit(np.ones((4, 3)), np.ones((4, 1)), verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded.optimizer, tf_lossscale.LossScaleOptimizer)
    assert float(loaded.optimizer.loss_scale) == float(
        model.optimizer.loss_scale)


def test_uninstall_restores_keras_own_compile():
    from keras.src.trainers.trainer import Trainer
    compile_fn = vars(Trainer)["compile"]
    compat.install()
    compat.uninstall()
    assert vars(Trainer)["compile"] is compile_fn
    assert "compile" not in vars(keras.Model)
