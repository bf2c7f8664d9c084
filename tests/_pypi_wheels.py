"""Wheels of public packages, downloaded from PyPI for tests that run real
third-party code or migrate it (Model Garden's `tf-models-official`).

Downloaded with pip (no dependencies) into a cache folder
(`TF_LOSSSCALE_CACHE`, default `~/.cache/tf_lossscale`), never committed.
CI reaches PyPI, so there a failed download fails the test; elsewhere it
is skipped with the reason.
"""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

CACHE = Path(os.environ.get("TF_LOSSSCALE_CACHE",
                            Path.home() / ".cache" / "tf_lossscale"))


def unavailable(message):
    """Skips where the wheel cannot be had; fails under CI, which must run
    the test."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message + "; CI must run the tests that use it")
    pytest.skip(message)


def wheel(package, version):
    """The wheel's path, downloaded once into CACHE."""
    folder = CACHE / "pypi"
    pattern = f"{package.replace('-', '_')}-{version}-*.whl"
    found = sorted(folder.glob(pattern))
    if not found:
        folder.mkdir(parents=True, exist_ok=True)
        try:
            result = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps",
                 "--only-binary=:all:", "--disable-pip-version-check",
                 "-d", str(folder), f"{package}=={version}"],
                capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as e:
            unavailable(f"pip download {package}=={version} failed: {e}")
        found = sorted(folder.glob(pattern))
        if result.returncode != 0 or not found:
            unavailable(f"pip download {package}=={version} failed "
                        f"(exit {result.returncode}): "
                        f"{result.stderr.strip()[-1000:]}")
    return found[0]


def python_files(wheel_path, into, prefix=""):
    """Extracts the wheel's .py files (those under `prefix`) into `into`;
    how many."""
    with zipfile.ZipFile(wheel_path) as archive:
        names = [n for n in archive.namelist()
                 if n.endswith(".py") and n.startswith(prefix)]
        for name in names:
            archive.extract(name, into)
    return len(names)
