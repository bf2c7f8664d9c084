"""Every ```python block of README.md and docs/*.md runs, as written.

Each block is a self-contained program that asserts its own result. A block
preceded by the line `<!-- test: own-process -->` runs in a process of its
own (it sets TF_USE_LEGACY_KERAS, makes logical devices or starts servers);
those processes all start at once, when the first of them is asked for, and
run beside the in-process blocks. The other blocks run in this process, each
in a fresh namespace and a fresh working directory; Keras' global dtype
policy and the environment variables are restored after each. ```sh,
```text and other blocks are not run.
The pages are found by globbing, so a page added to docs/ is tested too;
a program shown on several pages runs once.
"""

import linecache
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, NamedTuple

import keras
import pytest

ROOT = Path(__file__).resolve().parent.parent
OWN_PROCESS = "<!-- test: own-process -->"
FENCE = re.compile(r"^(?P<fence>`{3,}|~{3,})(?P<info>[^`\n]*)$")
TIMEOUT = 600


class Block(NamedTuple):
    path: Path
    line: int  # 1-based line of the opening fence.
    code: str
    own_process: bool

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def pages() -> List[Path]:
    return [ROOT / "README.md"] + sorted((ROOT / "docs").glob("**/*.md"))


def blocks_of(path: Path) -> List[Block]:
    """The fenced blocks whose info string is `python`, in order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence = opening.group("fence")
        end = i + 1
        while end < len(lines) and lines[end].strip() != fence:
            end += 1
        if opening.group("info").strip() == "python":
            previous = next((lines[j].strip() for j in range(i - 1, -1, -1)
                             if lines[j].strip()), "")
            found.append(Block(path, i + 1, "\n".join(lines[i + 1:end]) + "\n",
                               previous == OWN_PROCESS))
        i = end + 1
    return found


def distinct(blocks: List[Block]) -> List[Block]:
    """One block per distinct program: a page may repeat another's example
    (README and Getting started show the same two), which runs once."""
    seen: Dict[str, Block] = {}
    for block in blocks:
        seen.setdefault(block.code, block)
    return list(seen.values())


BLOCKS = [block for page in pages() for block in blocks_of(page)]
IN_PROCESS = distinct([b for b in BLOCKS if not b.own_process])
OWN = distinct([b for b in BLOCKS if b.own_process])


def _env() -> Dict[str, str]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_USE_LEGACY_KERAS", None)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    return env


@pytest.fixture(scope="module")
def own_processes():
    """Every own-process block, started together; block id -> Popen."""
    started = {}
    folder = tempfile.TemporaryDirectory()
    for n, block in enumerate(OWN):
        cwd = Path(folder.name) / str(n)
        cwd.mkdir()
        script = cwd / "example.py"
        script.write_text(block.code, encoding="utf-8")
        started[block.id] = subprocess.Popen(
            [sys.executable, str(script)], cwd=cwd, env=_env(),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    yield started
    for process in started.values():
        if process.poll() is None:
            process.kill()
            process.communicate()
    folder.cleanup()


def test_the_pages_hold_the_examples_the_readme_promises():
    readme = [b for b in BLOCKS if b.path.name == "README.md"]
    assert [("model.fit(" in b.code, "tf.GradientTape()" in b.code)
            for b in readme] == [(True, False), (False, True)]
    assert len(BLOCKS) >= 12 and OWN  # the site's pages were found


@pytest.mark.parametrize("block", IN_PROCESS, ids=[b.id for b in IN_PROCESS])
def test_block_runs(block, own_processes, tmp_path, monkeypatch):
    # `own_processes` starts the other blocks' processes, which run beside.
    monkeypatch.chdir(tmp_path)  # files a block writes land here
    namespace = {"__name__": "__main__"}
    environ = dict(os.environ)
    # A failing assert then shows its line of the page, not `???`.
    linecache.cache[block.id] = (len(block.code), None,
                                 block.code.splitlines(True), block.id)
    keras.utils.clear_session()  # nothing of an earlier test's state
    try:
        exec(compile(block.code, block.id, "exec"), namespace)
    finally:
        keras.mixed_precision.set_global_policy("float32")
        os.environ.clear()
        os.environ.update(environ)


@pytest.mark.parametrize("block", OWN, ids=[b.id for b in OWN])
def test_own_process_block_runs(block, own_processes):
    process = own_processes[block.id]
    stdout, stderr = process.communicate(timeout=TIMEOUT)
    assert process.returncode == 0, (
        f"{block.id} failed:\n{stdout[-2000:]}\n{stderr[-4000:]}")
