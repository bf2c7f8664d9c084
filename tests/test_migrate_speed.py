"""`migrate` is fast (issue 33, item 4): linear in a file's lines, a
50,000-line module within 500 MB, and the shortcuts it takes (the
transformer skips the nodes no rule acts on; a file's code is generated
only if a rule changed it) change nothing it writes.
"""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import _big_legacy_file
import pytest

from tf_lossscale.compat import migrate

ROOT = Path(__file__).resolve().parents[1]


def _functions(source):
    return source.count("def step_")


# Runs the command as its child and writes the child's peak resident
# memory (kB): from this small process, where a fork of the test process
# would count the test's own pages (TensorFlow's) in ru_maxrss.
_PEAK = """\
import resource, subprocess, sys
code = subprocess.run(sys.argv[2:]).returncode
with open(sys.argv[1], "w") as f:
    f.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
sys.exit(code)
"""


def _command(tmp_path, *args):
    """`python -m tf_lossscale ARGS`: exit code, stdout, stderr, and the
    peak resident memory of that process in kB."""
    peak = tmp_path / "peak"
    done = subprocess.run(
        [sys.executable, "-c", _PEAK, str(peak), sys.executable, "-m",
         "tf_lossscale", *args], capture_output=True, text=True, cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": os.environ["PATH"]})
    return done.returncode, done.stdout, done.stderr, int(peak.read_text())


@pytest.mark.slow
def test_fifty_thousand_lines_are_migrated_in_linear_time():
    times, results = [], []
    for lines in (10_000, 50_000):
        source = _big_legacy_file.source(lines)
        start = time.process_time()
        new, notes = migrate.rewrite(source)
        times.append(time.process_time() - start)
        results.append((source, new, notes))
    for source, new, notes in results:
        n = _functions(source)
        assert notes == []
        compile(new, "big.py", "exec")
        # Every function's legacy calls converted, none left.
        assert new.count("tf_lossscale.LossScaleOptimizer(inner_") == n
        assert new.count("dynamic=False, initial_scale=128") == n
        assert new.count("tf_lossscale.DynamicLossScale(1024)") == n
        assert "mp.LossScaleOptimizer" not in new
        assert "tf.train.experimental" not in new
    # Five times the lines: about five times the time (quadratic would be
    # 25); 7 leaves room for a loaded machine.
    assert times[1] < 7 * times[0], times


@pytest.mark.slow
def test_the_command_migrates_fifty_thousand_lines_within_500_mb(tmp_path):
    path = tmp_path / "big.py"
    source = _big_legacy_file.source(50_000)
    path.write_text(source)
    code, out, err, peak = _command(tmp_path, "migrate", "--write",
                                    str(path))
    assert code == 0, err
    assert out == f"wrote {path}\n"
    # The command (which does not import TensorFlow) peaks within 500 MB
    # (324 MB measured).
    assert peak < 500 * 1024, peak
    new = path.read_text()
    assert new.count("tf_lossscale.LossScaleOptimizer(inner_") == (
        _functions(source))
    # A second run changes nothing.
    code, out, err, _ = _command(tmp_path, "migrate", str(path))
    assert (code, out) == (0, ""), err


SOURCES = {
    "big": _big_legacy_file.source(300),
    "policy in a branch": """\
import tensorflow as tf
from tensorflow.keras.mixed_precision import experimental as mp
if flags.fp16:
    mp.set_policy(mp.Policy('mixed_float16', loss_scale=128))
def build(model):
    opt = tf.keras.optimizers.SGD()
    model.compile(optimizer=opt, loss='mse')
    print(model.optimizer.loss_scale())
""",
    "aliases": """\
import tensorflow.keras.mixed_precision.experimental as kmp
from tensorflow.train import experimental as tte
from tensorflow.keras import mixed_precision as m
x = kmp
y = tte.DynamicLossScale()
z = m.experimental.LossScaleOptimizer(opt, 'dynamic')
class My(kmp.LossScaleOptimizer):
    pass
if isinstance(o, kmp.LossScaleOptimizer):
    o.apply_gradients(g)
""",
    "graph rewrite": """\
import tensorflow as tf
opt = tf.compat.v1.train.experimental.enable_mixed_precision_graph_rewrite(
    tf.keras.optimizers.SGD(), loss_scale=64)
def f():
    return opt.loss_scale()
""",
}


class _Everything:
    def __contains__(self, item):
        return True


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_skipping_nodes_no_rule_acts_on_changes_nothing(name, monkeypatch):
    from tf_lossscale.compat.rewrite import context

    source = SOURCES[name]
    fast = migrate.rewrite(source)
    # The same rewrite with every node entered.
    collect = context.collect
    monkeypatch.setattr(context, "collect", lambda module, wanted: (
        collect(module, wanted)[0], _Everything()))
    slow = migrate.rewrite(source)
    assert fast == slow
    assert fast[0] != source


def test_a_file_no_rule_changes_is_given_back_as_read():
    # Nothing is generated again: the text is the very string read.
    source = "import tensorflow as tf\nx = tf.Variable(1.0)  # loss_scale\n"
    new, notes = migrate.rewrite(source)
    assert new is source and notes == []


def _patched(lines, diff):
    """`lines` with a unified diff applied."""
    out, i, k = [], 0, 2
    while k < len(diff):
        header = re.match(r"@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@",
                          diff[k])
        k += 1
        start = int(header.group(1)) - (1 if header.group(2) != "0" else 0)
        out += lines[i:start]
        i = start
        while k < len(diff) and not diff[k].startswith("@@"):
            line = diff[k]
            k += 1
            if line[0] == " ":
                assert lines[i] == line[1:]
                out.append(lines[i])
                i += 1
            elif line[0] == "-":
                assert lines[i] == line[1:]
                i += 1
            else:
                out.append(line[1:])
    return out + lines[i:]


def test_the_diff_of_a_large_module_gives_the_rewrite_back():
    import difflib

    source = _big_legacy_file.source(3000)
    new, _ = migrate.rewrite(source)
    old_lines = source.splitlines(keepends=True)
    new_lines = new.splitlines(keepends=True)
    ours = migrate._diff(Path("big.py"), source, new)
    assert ours[:2] == ["--- a/big.py\n", "+++ b/big.py\n"]
    assert _patched(old_lines, ours) == new_lines
    # No longer than difflib's own.
    theirs = list(difflib.unified_diff(old_lines, new_lines))
    changed = [line for line in ours if line[0] in "+-"]
    assert len(changed) <= len([line for line in theirs if line[0] in "+-"])
