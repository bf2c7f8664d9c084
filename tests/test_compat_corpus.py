"""The legacy corpus (compat/examples/) trains through the runner, and,
rewritten by `migrate`, trains the same without the shim, with Keras 3 and
with tf_keras (TF_USE_LEGACY_KERAS=1); README's migration examples are the
ones run here.

The comparison is the differential rule of `migrate` (issue 19): the
migrated script's per-step losses and final weights (every script prints
them as a JSON line) equal those of the original under the shim, or
`migrate` exited 1 naming the line the migrated script fails on.

Every script runs in a process of its own (they set global policies, TF1
graph mode, logical devices) and checks itself that its model learned (it
exits non-zero otherwise). The processes are forked from one that imported
TensorFlow already, one such batch per Keras (tests/_script_batch.py): the
import was most of the time of each run. The two batches run together in
one module fixture; each test then checks one run. A script runs with tf_keras where
that Keras takes another path through the shim (its policy API, its compile,
its optimizer flavour), with Keras 3 always.
"""

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys

import keras
import pytest

import tf_lossscale.compat
from tf_lossscale import cli
from tf_lossscale.compat import migrate

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(REPO, "compat", "examples")
README = os.path.join(REPO, "docs", "migrating.md")
LOSSES = re.compile(r"initial loss ([\d.]+).*?final loss ([\d.]+)", re.DOTALL)

KERAS_3, TF_KERAS = "keras3", "tf_keras"
BOTH = (KERAS_3, TF_KERAS)
# Script -> the Kerases it runs with; the pattern it holds, in comments.
CORPUS = {
    # TF 2.1-2.3: tf.keras.mixed_precision.experimental, tf.train.experimental.
    "custom_loop.py": (KERAS_3,),  # get_scaled_loss in a custom loop
    "keras_fit_policy.py": BOTH,  # set_policy, compile wraps, module import
    "loss_scale_forms.py": (KERAS_3,),  # each form of loss_scale=
    "mirrored_loop.py": (KERAS_3,),  # MirroredStrategy custom loop
    "loss_scale_object.py": BOTH,  # optimizer.loss_scale() in a trainer
    "guide_policy_reads.py": BOTH,  # policy.loss_scale reads: reported
    "graph_rewrite_fit.py": BOTH,  # enable_mixed_precision_graph_rewrite
    # No Keras: TF1 and the bare loss scale.
    "dynamic_loss_scale.py": (KERAS_3,),
    "tf1_session.py": (KERAS_3,),
    "graph_rewrite_tf1.py": (KERAS_3,),  # the graph rewrite in a Session
    # TF 2.4-2.15: tf.keras.mixed_precision.LossScaleOptimizer.
    "tf24_fit_global_policy.py": BOTH,  # compile wraps under set_global_policy
    "tf24_custom_loop.py": (KERAS_3,),
    "models_configure_optimizer.py": BOTH,  # dynamic=False, minimize
    "models_explicit_allreduce.py": BOTH,  # experimental_aggregate_gradients
    # Patterns of public projects (the repository each follows, in its
    # docstring or below).
    "hf_compile_fit.py": (KERAS_3,),  # positional 'dynamic', compile + fit
    "accumulate_gradients.py": BOTH,  # unscale in one function, apply later
    "models_resnet_ctl.py": (KERAS_3,),  # Policy(loss_scale=flag), isinstance
    "asr_compile_override.py": BOTH,  # a compile override that wraps
    "train_step_minimize_tape.py": BOTH,  # minimize(loss, vars, tape=tape)
    "checkpoint_resume.py": (KERAS_3,),  # CheckpointManager save and restore
    "save_load_model.py": BOTH,  # model.save + load_model, compile wrapped
    "lr_through_wrapper.py": BOTH,  # LearningRateScheduler, lr writes
    "legacy_optimizer_fallback.py": BOTH,  # optimizers.legacy.Adam wrapped
    # Issue 19: what migrate once got silently wrong.
    "ner_unscaled_apply.py": BOTH,  # experimental, gradients never scaled
    "compat_v2_alias_loop.py": (KERAS_3,),  # import tensorflow.compat.v2
    "bert_tf1_graph_rewrite_scaler.py": (KERAS_3,),  # own optimizer + scaler
    "bert_tf2_loss_scale_log.py": BOTH,  # 'Loss scale %g' % loss_scale
    "automl_conditional_policy.py": BOTH,  # policy from a conditional
}
# Scripts `migrate` cannot convert completely: the lines it must name (of
# the file as written), in the order it names them (file by file, by name).
REPORTED = {
    "asr_compile_override.py": [39, 42, 70],
    "bert_tf1_graph_rewrite_scaler.py": [36],
    "bert_tf2_loss_scale_log.py": [49, 50, 51, 53],
    "guide_policy_reads.py": [27, 29, 30, 49],
    "models_resnet_ctl.py": [25, 38, 87],
}
# The per-step losses and final weights every script prints, as one JSON
# line: the loss of each training step (under `fit`, the loss a batch-level
# callback is given: the epoch's running mean up to that batch) and the
# first values of each trainable variable after training.
RESULT = re.compile(r'^(\{"losses": .*\})$', re.MULTILINE)
# Runs that fail for want of a core feature (strict: they must fail).
NEEDS_CORE: dict = {}  # (script, Keras) -> the core defect it waits for


BATCH = os.path.join(REPO, "tests", "_script_batch.py")


def _start_batch(jobs, keras_flavour, folder):
    """Starts the runs `jobs` ((args, cwd) each) of one Keras in a batch."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3",
           "PYTHONWARNINGS": "ignore::DeprecationWarning"}
    env.pop("TF_USE_LEGACY_KERAS", None)
    if keras_flavour == TF_KERAS:
        env["TF_USE_LEGACY_KERAS"] = "1"
    jobs_path = folder / f"{keras_flavour}-jobs.json"
    results_path = folder / f"{keras_flavour}-results.json"
    jobs_path.write_text(json.dumps([{"args": args, "cwd": cwd}
                                     for args, cwd in jobs]))
    process = subprocess.Popen(
        [sys.executable, BATCH, str(jobs_path), str(results_path)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return process, results_path


def _finish_batch(started):
    """The runs of a batch, as subprocess.CompletedProcess objects."""
    (process, results_path), jobs = started
    output, _ = process.communicate(timeout=1800)
    assert process.returncode == 0, output[-3000:]
    return [subprocess.CompletedProcess(args, r["returncode"], r["stdout"],
                                        r["stderr"])
            for (args, _), r in zip(jobs, json.loads(
                results_path.read_text()))]


def _jobs(rewritten):
    """(script, how, keras) -> (args, cwd) for every run of the corpus."""
    jobs = {}
    for name, kerases in CORPUS.items():
        for flavour in kerases:
            jobs[(name, "shim", flavour)] = (
                ["-m", "tf_lossscale.compat", f"compat/examples/{name}"], REPO)
            jobs[(name, "rewritten", flavour)] = ([name], str(rewritten))
    jobs[("custom_loop.py", "legacy", KERAS_3)] = (
        ["compat/examples/custom_loop.py"], REPO)
    return jobs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(script, how, keras) -> its run; also what `migrate --write` did."""
    rewritten = tmp_path_factory.mktemp("rewritten")
    for name in CORPUS:
        shutil.copy(os.path.join(EXAMPLES, name), rewritten)
    report = io.StringIO()
    with contextlib.redirect_stderr(report):
        code = migrate.run([str(rewritten)], write=True)
    jobs = _jobs(rewritten)
    folder = tmp_path_factory.mktemp("batches")
    started = {}
    for flavour in BOTH:
        keys = [key for key in jobs if key[2] == flavour]
        started[flavour] = keys, (_start_batch([jobs[k] for k in keys],
                                               flavour, folder),
                                  [jobs[k] for k in keys])
    results = {}
    for keys, batch in started.values():
        results.update(zip(keys, _finish_batch(batch)))
    results["migrate"] = (code, report.getvalue(), rewritten)
    return results


def _losses(run):
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    losses = [float(v) for pair in LOSSES.findall(run.stdout) for v in pair]
    assert losses, run.stdout
    return losses


def _result(run):
    """The JSON line of per-step losses and final weights the run printed."""
    found = RESULT.findall(run.stdout)
    assert len(found) == 1, run.stdout[-2000:]
    result = json.loads(found[0])
    assert result["losses"] and result["weights"], found[0]
    return result


def _failing_line(run, name):
    """The line of script `name` that the run's traceback ends in."""
    lines = re.findall(rf'File ".*?{re.escape(name)}", line (\d+)',
                       run.stderr)
    return int(lines[-1]) if lines else None


def _params(how):
    params = []
    for name, kerases in CORPUS.items():
        for flavour in kerases:
            reason = NEEDS_CORE.get((name, flavour))
            marks = [pytest.mark.xfail(strict=True, reason=reason)
                     ] if reason else []
            params.append(pytest.param(name, flavour, marks=marks,
                                       id=f"{name}-{flavour}"))
    return params


def test_every_script_of_the_corpus_is_run():
    assert sorted(CORPUS) == sorted(
        n for n in os.listdir(EXAMPLES) if n.endswith(".py"))


@pytest.mark.slow
@pytest.mark.parametrize("name,flavour", _params("shim"))
def test_legacy_script_trains_through_the_runner(runs, name, flavour):
    run = runs[(name, "shim", flavour)]
    _losses(run)
    _result(run)
    # The legacy names reached tf_lossscale's objects, not Keras' or TF's.
    assert re.search(r"(optimizer|loss scale):? tf_lossscale\.", run.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("name,flavour", _params("rewritten"))
def test_rewritten_script_trains_alike_without_the_shim(runs, name,
                                                        flavour):
    """The differential rule of `migrate`: the migrated script computes what
    the original computes under the shim, or `migrate` named the line the
    migrated script fails on."""
    shim_run = runs[(name, "shim", flavour)]
    shim = _losses(shim_run)
    expected = _result(shim_run)
    rewritten = runs[(name, "rewritten", flavour)]
    if rewritten.returncode != 0 and name in REPORTED:
        assert _failing_line(rewritten, name) in REPORTED[name], (
            rewritten.stderr[-3000:])
        return
    assert _losses(rewritten) == pytest.approx(shim, rel=1e-3)
    assert re.search(r"(optimizer|loss scale):? tf_lossscale\.",
                     rewritten.stdout)
    result = _result(rewritten)
    assert len(result["losses"]) == len(expected["losses"])
    assert result["losses"] == pytest.approx(expected["losses"],
                                             rel=1e-4, abs=1e-6)
    assert len(result["weights"]) == len(expected["weights"])
    assert result["weights"] == pytest.approx(expected["weights"],
                                              rel=1e-4, abs=1e-6)


@pytest.mark.slow
def test_migrate_converts_the_corpus_or_names_each_line(runs):
    code, report, rewritten = runs["migrate"]
    assert code == 1
    named = [(os.path.basename(path), int(line)) for path, line in
             re.findall(r"^(.*?):(\d+): ", report, re.MULTILINE)]
    assert named == [(name, line) for name, lines in REPORTED.items()
                     for line in lines]
    for name in CORPUS:
        text = (rewritten / name).read_text()
        with open(os.path.join(EXAMPLES, name), encoding="utf-8") as f:
            assert text != f.read(), name
        if name not in REPORTED:
            assert migrate.rewrite(text) == (text, []), name


@pytest.mark.slow
def test_legacy_script_fails_without_the_shim(runs):
    run = runs[("custom_loop.py", "legacy", KERAS_3)]
    assert run.returncode == 1
    assert ("ImportError: cannot import name 'experimental' from "
            "'tensorflow.keras.mixed_precision'" in run.stderr)


@pytest.mark.slow
def test_dynamic_loss_scale_script_skips_overflowing_steps(runs):
    stdout = runs[("dynamic_loss_scale.py", "shim", KERAS_3)].stdout
    skipped = int(re.search(r"skipped steps (\d+)", stdout).group(1))
    scale = float(re.search(r"final loss scale (\S+)", stdout).group(1))
    assert skipped >= 1
    assert scale < 2**15


@pytest.mark.slow
@pytest.mark.parametrize("flavour", BOTH)
def test_policy_reads_print_loss_scale_objects_under_the_shim(runs, flavour):
    stdout = runs[("guide_policy_reads.py", "shim", flavour)].stdout
    assert re.search(r"^Loss scale: DynamicLossScale\(current_loss_scale="
                     r"32768\.0, ", stdout, re.MULTILINE)
    assert "\nFixedLossScale(1024.0)\n" in stdout
    assert re.search(r"^Optimizer loss scale: DynamicLossScale\("
                     r"current_loss_scale=\d+\.0, num_good_steps=\d+, "
                     r"initial_loss_scale=32768\.0, increment_period=2000, "
                     r"multiplier=2\.0\)$", stdout, re.MULTILINE)


@pytest.mark.slow
@pytest.mark.parametrize("flavour", BOTH)
def test_policy_of_the_module_import_reaches_the_layers(runs, flavour):
    stdout = runs[("keras_fit_policy.py", "shim", flavour)].stdout
    assert "compute dtype float16" in stdout


# README's migration section.

def _readme_blocks(language):
    text = open(README, encoding="utf-8").read()
    section = text.split("<!-- section:migration -->")[1].split(
        "<!-- section:")[0]
    return re.findall(rf"```{language}\n(.*?)```", section, re.DOTALL)


@pytest.fixture
def clean_keras_state():
    yield
    tf_lossscale.compat.uninstall()
    keras.config.set_dtype_policy("float32")


def test_readme_install_example_runs(clean_keras_state):
    (example,) = _readme_blocks("python")
    exec(compile(example, "README.md", "exec"), {})
    assert not tf_lossscale.compat.installed()


@pytest.mark.slow
def test_readme_runner_example_is_a_corpus_run_with_its_output(runs):
    commands = _readme_blocks("sh")
    assert commands[0] == (
        "python -m tf_lossscale.compat compat/examples/custom_loop.py\n")
    shown = [float(v) for v in re.findall(r"loss ([\d.]+)",
                                          _readme_blocks("text")[0])]
    measured = _losses(runs[("custom_loop.py", "shim", KERAS_3)])
    assert shown == pytest.approx(measured, rel=1e-2)


def test_readme_migrate_example_prints_the_diff_shown(monkeypatch, capsys):
    commands = _readme_blocks("sh")
    assert commands[1] == (
        "python -m tf_lossscale migrate compat/examples/custom_loop.py\n")
    monkeypatch.chdir(REPO)
    assert cli.main(commands[1].split()[3:]) == 0
    assert capsys.readouterr().out == _readme_blocks("diff")[0]
