"""The command line as a user meets it: run as subprocesses, both as the
`tf-lossscale` console script and as `python -m tf_lossscale`.

`--help` and `--version` must answer without importing TensorFlow (no
start-up lines, no seconds spent loading it), and each invocation must call
itself by the name it was invoked with.
"""

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import tf_lossscale
from tf_lossscale import cli

REPO = Path(__file__).resolve().parent.parent


def _env() -> dict:
    """The caller's environment without TF_CPP_MIN_LOG_LEVEL, so that an
    import of TensorFlow would show its start-up lines on stderr."""
    env = dict(os.environ)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    return env


def _run(cmd: list) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True,
                          text=True, timeout=300, check=False)


def _console_script() -> str:
    """The `tf-lossscale` script that installing the package made."""
    name = "tf-lossscale.exe" if os.name == "nt" else "tf-lossscale"
    for folder in (Path(sys.executable).parent,
                   Path(sysconfig.get_path("scripts"))):
        if (folder / name).is_file():
            return str(folder / name)
    found = shutil.which("tf-lossscale")
    assert found, ("no tf-lossscale console script beside "
                   f"{sys.executable}: install the package (pip install -e .)")
    return found


MODULE = [sys.executable, "-m", "tf_lossscale"]


def _installed_version() -> str:
    return importlib.metadata.version("tf_lossscale")


def test_version_as_module():
    result = _run(MODULE + ["--version"])
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"tf_lossscale {_installed_version()}\n"
    assert re.fullmatch(r"tf_lossscale \d+\.\d+\.\d+\n", result.stdout)


def test_version_as_console_script():
    result = _run([_console_script(), "--version"])
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"tf_lossscale {_installed_version()}\n"


def test_version_falls_back_to_the_source_tree(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert cli.version() == tf_lossscale.__version__


def test_help_as_module_names_the_module():
    result = _run(MODULE + ["--help"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(
        "usage: python -m tf_lossscale [-h] [--version] "
        "{demo,bench,migrate} ...\n")
    for command in ("demo", "bench", "migrate"):
        assert re.search(rf"^\s+{command}\s+\S", result.stdout, re.MULTILINE), \
            result.stdout


def test_help_as_console_script_names_the_script():
    result = _run([_console_script(), "--help"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(
        "usage: tf-lossscale [-h] [--version] {demo,bench,migrate} ...\n")
    # Named as invoked; the one `python -m` is the shim's runner, listed.
    assert not re.search(r"python -m tf_lossscale(?!\.compat)",
                         result.stdout), result.stdout


def test_subcommand_help_keeps_the_program_name():
    script = _run([_console_script(), "demo", "--help"])
    assert script.returncode == 0, script.stderr
    assert script.stdout.startswith("usage: tf-lossscale demo [-h]")
    module = _run(MODULE + ["migrate", "--help"])
    assert module.returncode == 0, module.stderr
    assert module.stdout.startswith(
        "usage: python -m tf_lossscale migrate [-h] [--write] PATH")


def test_missing_subcommand_is_a_usage_error_under_the_invoked_name():
    script = _run([_console_script()])
    assert script.returncode == 2
    assert script.stdout == ""
    assert script.stderr.splitlines()[-1] == (
        "tf-lossscale: error: the following arguments are required: "
        "command")
    module = _run(MODULE + ["frobnicate"])
    assert module.returncode == 2
    assert module.stderr.splitlines()[-1].startswith(
        "python -m tf_lossscale: error: argument command: invalid choice: "
        "'frobnicate'")


def test_help_and_version_print_no_tensorflow_start_up_lines():
    for args in (["--help"], ["--version"], ["demo", "--help"]):
        for cmd in (MODULE, [_console_script()]):
            result = _run(cmd + args)
            assert result.returncode == 0, result.stderr
            assert result.stderr == "", (cmd + args, result.stderr)


def _imported_modules(importtime_stderr: str) -> set:
    """Module names from `-X importtime` lines ("import time: a | b | name")."""
    names = set()
    for line in importtime_stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            if name != "package":  # the header line
                names.add(name)
    return names


def test_help_and_version_do_not_import_tensorflow():
    env = _env()
    env["PYTHONPROFILEIMPORTTIME"] = "1"  # as -X importtime, for the script
    for args in (["--help"], ["--version"], ["bench", "--help"]):
        for cmd in (MODULE, [sys.executable, _console_script()]):
            result = subprocess.run(cmd + args, cwd=REPO, env=env,
                                    capture_output=True, text=True,
                                    timeout=300, check=False)
            assert result.returncode == 0, result.stderr[-2000:]
            imported = _imported_modules(result.stderr)
            assert "tf_lossscale.cli" in imported, result.stderr[-2000:]
            heavy = sorted(m for m in imported
                           if m.split(".")[0] in ("tensorflow", "keras",
                                                  "tf_keras"))
            assert heavy == [], (cmd + args, heavy[:10])


# The demo's start-up: TensorFlow's C++ lines (oneDNN, CUDA, cpu_feature_guard,
# absl's pre-InitializeLog notice) must not land between its intro and its
# progress bar, unless the user set TF_CPP_MIN_LOG_LEVEL.

# A line of TensorFlow's C++ logging ("I0000 00:00:17... cudart_stub.cc:31]
# ...") or one of its start-up notices.
TF_START_UP_LINE = re.compile(
    r"^[IWEF]\d{4} [\d:.]+ +\d+ \S+\.cc:\d+\]|absl::InitializeLog|oneDNN|"
    r"cpu_feature_guard|cudart_stub|cuInit|rebuild TensorFlow", re.M)


def _demo(tmp_path: Path, env: dict) -> subprocess.CompletedProcess:
    result = subprocess.run(
        MODULE + ["demo", "--steps", "4", "--out", str(tmp_path / "out")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
        check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_demo_prints_no_tensorflow_start_up_lines(tmp_path):
    env = _env()
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    result = _demo(tmp_path, env)
    assert TF_START_UP_LINE.search(result.stdout) is None, result.stdout
    assert TF_START_UP_LINE.search(result.stderr) is None, result.stderr
    # The intro comes first, the summary follows the progress bar.
    assert result.stdout.index("2^24") < result.stdout.index("4/4")


def test_demo_keeps_a_user_set_log_level(tmp_path):
    env = _env()
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    env["TF_CPP_MIN_LOG_LEVEL"] = "0"  # the user asked for everything
    result = _demo(tmp_path, env)
    # Level 0 on this machine: TensorFlow's C++ start-up lines do show.
    assert TF_START_UP_LINE.search(result.stderr), result.stderr[-3000:]


def test_quiet_start_leaves_a_user_set_level_alone(monkeypatch):
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "1")
    assert cli.quiet_tensorflow_start() is False
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "1"


def test_top_level_help_lists_the_shims_runner():
    result = _run(MODULE + ["--help"])
    assert result.returncode == 0, result.stderr
    assert "python -m tf_lossscale.compat SCRIPT [ARGS...]" in result.stdout
    assert "https://tf-lossscale.github.io/tf_lossscale/" in result.stdout


def test_bench_help_says_what_it_measures_how_long_and_where():
    result = _run(MODULE + ["bench", "--help"])
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    for part in ("compile + train_on_batch", "GradientTape loop",
                 "get_unscaled_gradients and its finite check",
                 "short (default) fit (40 x Dense(512)", "about 5 minutes",
                 "--targets what a change to the step is checked against",
                 "7 to 12 minutes", "--quick every workload",
                 "about 16 minutes",
                 "--full every workload and target at full size",
                 "about 40 minutes",
                 "needs a source checkout"):
        assert part in text, part
    # Every line fits 80 columns (the presets' text is wrapped to it).
    assert max(map(len, result.stdout.splitlines())) <= 80


def test_bench_presets_exclude_each_other_and_a_bad_preset_is_refused():
    result = _run(MODULE + ["bench", "--quick", "--full"])
    assert result.returncode == 2
    assert "not allowed with argument" in result.stderr
    from tf_lossscale import bench
    with pytest.raises(ValueError, match="preset must be one of short, "
                       "targets, quick, full; got 'fast'"):
        bench.run("fast")


def test_shim_runner_help_answers_without_tensorflow():
    runner = [sys.executable, "-m", "tf_lossscale.compat", "--help"]
    result = _run(runner)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m tf_lossscale.compat")
    for part in ("mixed_precision.experimental", "get_scaled_loss",
                 "enable,disable}_mixed_precision_graph_rewrite",
                 "python -m tf_lossscale migrate PATH"):
        assert part in result.stdout, part
    assert result.stderr == ""  # no TensorFlow start-up lines
    env = dict(_env(), PYTHONPROFILEIMPORTTIME="1")
    timed = subprocess.run(runner, cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=300, check=False)
    imported = _imported_modules(timed.stderr)
    assert "tf_lossscale.compat.__main__" in imported or (
        "tf_lossscale.compat" in imported), timed.stderr[-2000:]
    heavy = sorted(m for m in imported
                   if m.split(".")[0] in ("tensorflow", "keras", "tf_keras"))
    assert heavy == [], heavy[:10]
