"""The legacy corpus (compat/examples/) trains through the runner, and,
rewritten by `migrate`, trains the same without the shim; README's migration
examples are the ones run here.

Every script runs in its own process (they set global policies, TF1 graph
mode, logical devices). The runs start together, two at a time, in one
module fixture; each test then checks one script.
"""

import concurrent.futures
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
SCRIPTS = sorted(name for name in os.listdir(EXAMPLES) if name.endswith(".py"))
README = os.path.join(REPO, "README.md")
LOSSES = re.compile(r"initial loss ([\d.]+).*?final loss ([\d.]+)", re.DOTALL)


def _run(args, cwd):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3",
           "PYTHONWARNINGS": "ignore::DeprecationWarning"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """script -> {"shim": run, "rewritten": run}; "legacy" runs one plainly."""
    rewritten = tmp_path_factory.mktemp("rewritten")
    for name in SCRIPTS:
        shutil.copy(os.path.join(EXAMPLES, name), rewritten)
    left = migrate.run([str(rewritten)], write=True)
    jobs = {(name, "shim"): (["-m", "tf_lossscale.compat",
                              f"compat/examples/{name}"], REPO)
            for name in SCRIPTS}
    jobs.update({(name, "rewritten"): ([name], rewritten)
                 for name in SCRIPTS})
    jobs[("custom_loop.py", "legacy")] = (["compat/examples/custom_loop.py"],
                                          REPO)
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        futures = {key: pool.submit(_run, *job) for key, job in jobs.items()}
    results = {}
    for (name, how), future in futures.items():
        results.setdefault(name, {})[how] = future.result()
    results["migrate exit code"] = left
    results["rewritten folder"] = rewritten
    return results


def _losses(run):
    assert run.returncode == 0, run.stderr[-3000:]
    pairs = [(float(a), float(b)) for a, b in LOSSES.findall(run.stdout)]
    assert pairs, run.stdout
    return pairs


@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS)
def test_legacy_script_trains_through_the_runner(runs, name):
    run = runs[name]["shim"]
    for initial, final in _losses(run):
        assert final < initial / 5, run.stdout
    # The legacy names reached tf_lossscale's classes, not TensorFlow's.
    assert re.search(r"(optimizer|loss scale):? tf_lossscale\.", run.stdout)


@pytest.mark.slow
def test_legacy_script_fails_without_the_shim(runs):
    run = runs["custom_loop.py"]["legacy"]
    assert run.returncode == 1
    assert ("ImportError: cannot import name 'experimental' from "
            "'tensorflow.keras.mixed_precision'" in run.stderr)


@pytest.mark.slow
def test_dynamic_loss_scale_script_skips_overflowing_steps(runs):
    stdout = runs["dynamic_loss_scale.py"]["shim"].stdout
    skipped = int(re.search(r"skipped steps (\d+)", stdout).group(1))
    scale = float(re.search(r"final loss scale (\S+)", stdout).group(1))
    assert skipped >= 1
    assert scale < 2**15


@pytest.mark.slow
def test_corpus_rewrites_completely(runs):
    assert runs["migrate exit code"] == 0
    for name in SCRIPTS:
        text = (runs["rewritten folder"] / name).read_text()
        with open(os.path.join(EXAMPLES, name), encoding="utf-8") as f:
            assert text != f.read(), name
        assert migrate.rewrite(text) == (text, []), name


@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS)
def test_rewritten_script_trains_the_same_without_the_shim(runs, name):
    shim, rewritten = _losses(runs[name]["shim"]), _losses(
        runs[name]["rewritten"])
    # Flat lists: pytest >= 9.2 rejects nested structures in approx.
    flat = [loss for pair in rewritten for loss in pair]
    assert len(rewritten) == len(shim)
    assert flat == pytest.approx([loss for pair in shim for loss in pair],
                                 rel=1e-3)


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
    (measured,) = _losses(runs["custom_loop.py"]["shim"])
    assert shown == pytest.approx(list(measured), rel=1e-2)


def test_readme_migrate_example_prints_the_diff_shown(monkeypatch, capsys):
    commands = _readme_blocks("sh")
    assert commands[1] == (
        "python -m tf_lossscale migrate compat/examples/custom_loop.py\n")
    monkeypatch.chdir(REPO)
    assert cli.main(commands[1].split()[3:]) == 0
    assert capsys.readouterr().out == _readme_blocks("diff")[0]
