"""A policy in one module, `compile` in another (issue 33, item 1): the
modules of one `migrate` run are one program. The optimizer of the other
module's compile is wrapped as the policy had it wrapped, if mixed_float16
is in force when it runs; the policy's `loss_scale` is then carried, not
reported; where the run's policies disagree, the compile is reported.
"""

import textwrap

import _legacy_programs
import numpy as np
import pytest

from tf_lossscale.compat import migrate
from tf_lossscale.compat.rewrite import module_facts, rewrite, run_facts

POLICY = textwrap.dedent("""\
    import tensorflow as tf
    from tensorflow.keras.mixed_precision import experimental as mp
    policy = mp.Policy('mixed_float16', loss_scale=128)
    mp.set_policy(policy)
    """)
MODEL = textwrap.dedent("""\
    import tensorflow as tf


    def build(model):
        model.compile(optimizer=tf.keras.optimizers.SGD(0.01), loss='mse')
    """)
# The program: the policy module runs first, then the model module's
# compile; a kernel gradient of 8 overflows float16 at Keras' dynamic 32768
# (the step is skipped) and not at 128.
DRIVER = textwrap.dedent("""\
    import numpy as np
    import tensorflow as tf
    tf.keras.utils.set_random_seed(1)
    model = tf.keras.Sequential([
        tf.keras.layers.Dense(1, kernel_initializer='ones')])
    model.build((None, 4))
    build(model)
    x = np.full((8, 4), 1.0, np.float32)
    y = np.zeros((8, 1), np.float32)
    kernels = []
    for _ in range(3):
        model.train_on_batch(x, y)
        kernels.append(model.layers[0].kernel.numpy().copy())
    scale = float(model.optimizer.loss_scale)
    tf.keras.mixed_precision.set_global_policy('float32')
    """)


def _run(capsys, tmp_path, files):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    code = migrate.run([str(tmp_path / name) for name in files], write=True)
    _, err = capsys.readouterr()
    return code, {name: (tmp_path / name).read_text() for name in files}, [
        line for line in err.splitlines() if not line.startswith("migrate:")]


def test_a_policys_fixed_scale_wraps_the_compile_of_another_module(
        capsys, tmp_path):
    code, new, err = _run(capsys, tmp_path,
                          {"policy.py": POLICY, "model.py": MODEL})
    assert (code, err) == (0, [])
    assert "loss_scale" not in new["policy.py"]
    assert ("optimizer=tf_lossscale.experimental.LossScaleOptimizer("
            "tf.keras.optimizers.SGD(0.01), 128) if "
            "tf.keras.mixed_precision.global_policy().name == "
            "'mixed_float16' else tf.keras.optimizers.SGD(0.01)") in (
        new["model.py"])
    # Migrated alone, the policy module still reports its scale.
    alone, notes = rewrite(POLICY)
    assert [n.line for n in notes] == [3] and "loss_scale=128" in alone


def test_policies_of_the_run_that_disagree_are_reported_at_compile(
        capsys, tmp_path):
    code, new, err = _run(capsys, tmp_path, {
        "a.py": POLICY, "b.py": POLICY.replace("128", "256"),
        "model.py": MODEL})
    assert code == 1
    assert [line.split(": ", 1)[0].rsplit("/", 1)[-1] for line in err] == [
        "a.py:3", "b.py:3", "model.py:5"]
    assert "the other modules of this run set policies that scale " \
        "differently" in err[2]
    assert new["model.py"] == MODEL


def test_a_module_with_its_own_float32_policy_is_not_wrapped():
    facts = run_facts([module_facts(POLICY), module_facts(MODEL)])
    own = MODEL.replace(
        "def build", "tf.keras.mixed_precision.set_global_policy("
        "'float32')\n\n\ndef build")
    new, notes = rewrite(own, facts)
    assert notes == [] and "LossScaleOptimizer" not in new


def test_re_compile_is_not_a_keras_compile():
    assert not module_facts("import re\nx = re.compile('a')\n").compiles
    assert module_facts("model.compile('sgd')\n").compiles


def test_the_migrated_program_trains_as_the_legacy_one_under_the_shim():
    legacy = _legacy_programs.run(POLICY + MODEL + DRIVER, shim=True)
    facts = run_facts([module_facts(POLICY), module_facts(MODEL)])
    policy, _ = rewrite(POLICY, facts)
    model, _ = rewrite(MODEL, facts)
    migrated = _legacy_programs.run(policy + model + DRIVER, shim=False)
    assert legacy["scale"] == migrated["scale"] == 128.0
    np.testing.assert_allclose(migrated["kernels"], legacy["kernels"],
                               rtol=1e-6)
    # The first step moved the kernel (at Keras' dynamic 32768 it would
    # have been skipped).
    assert not np.allclose(legacy["kernels"][0], 1.0)
    # Each module migrated alone (before runs were one program): the model
    # module is left as it was, the policy module keeps its reported
    # loss_scale, which today's Policy refuses.
    assert rewrite(MODEL) == (MODEL, [])
    with pytest.raises(TypeError, match="loss_scale"):
        _legacy_programs.run(rewrite(POLICY)[0] + MODEL + DRIVER,
                             shim=False)


def test_a_run_whose_policies_have_no_loss_scale_of_their_own_is_alone():
    # Keras' compile wraps the other modules' optimizers under
    # mixed_float16 dynamically, as TF 2.4-2.15's did: nothing to carry
    # (a repository's test modules set policies for themselves).
    dynamic = "import tensorflow as tf\n" \
        "tf.keras.mixed_precision.set_global_policy(flags.dtype)\n"
    facts = run_facts([module_facts(dynamic), module_facts(MODEL)])
    assert facts == run_facts([])
    assert rewrite(MODEL, facts) == (MODEL, [])


def test_a_second_run_leaves_its_own_conditional_wrap_unreported():
    # A policy chosen at run time and an optimizer that may be wrapped
    # already: the first run writes a conditional inside a conditional.
    legacy = textwrap.dedent("""\
        import tensorflow as tf
        tf.keras.mixed_precision.set_global_policy(
            'mixed_float16' if fp16 else 'float32')
        optimizer = make()
        model.compile(optimizer=optimizer)
        """)
    once, notes = rewrite(legacy)
    assert notes == [] and once.count(" if ") == 3
    assert rewrite(once) == (once, [])
