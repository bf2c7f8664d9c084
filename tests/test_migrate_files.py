"""`migrate` on any tree (issue 33, item 3): a file it cannot read, parse or
write gets one `file: reason` line and exit 2 while every other file is
still migrated; `--write` replaces a file whole or not at all and names what
it wrote; encodings as Python reads them; links not followed out of the tree
or in loops; a second run over its own output changes nothing and exits 0.
"""

import os
import stat
import sys

import pytest

from tf_lossscale.compat import migrate

LEGACY = ("import tensorflow as tf\n"
          "ls = tf.train.experimental.DynamicLossScale()\n")
MIGRATED = ("import tensorflow as tf\nimport tf_lossscale\n\n"
            "ls = tf_lossscale.DynamicLossScale()\n")


def _run(capsys, *paths, write=True):
    code = migrate.run([str(p) for p in paths], write=write)
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.splitlines()


def _problems(err):
    """The report lines, without migrate's own summary lines."""
    return [line for line in err if not line.startswith("migrate: ")]


@pytest.fixture
def tree(tmp_path):
    """A folder with one good legacy file, `good.py`."""
    (tmp_path / "good.py").write_text(LEGACY)
    return tmp_path


def _assert_one_problem_and_the_rest_migrated(capsys, tree, bad, reason):
    code, out, err = _run(capsys, tree)
    assert code == 2
    assert _problems(err) == [f"{bad}{reason}"]
    assert (tree / "good.py").read_text() == MIGRATED
    assert out == [f"wrote {tree / 'good.py'}"]
    assert err[-1] == ("migrate: 1 files could not be migrated (listed "
                       "above); the others were")


def test_non_utf8_file_without_a_coding_line(capsys, tree):
    bad = tree / "latin.py"
    bad.write_bytes(b"# caf\xe9\n" + LEGACY.encode())
    _assert_one_problem_and_the_rest_migrated(
        capsys, tree, bad, ":1: cannot read: byte 0xe9 is not utf-8 and no "
        "coding line (PEP 263) names another encoding")
    assert bad.read_bytes() == b"# caf\xe9\n" + LEGACY.encode()


@pytest.mark.parametrize("codec,name", [("utf-16", "UTF-16"),
                                        ("utf-32", "UTF-32")])
def test_utf16_and_utf32_files(capsys, tree, codec, name):
    bad = tree / "wide.py"
    bad.write_bytes(LEGACY.encode(codec))  # with its byte-order mark
    _assert_one_problem_and_the_rest_migrated(
        capsys, tree, bad, f": cannot read: {name} (it starts with a {name} "
        "byte-order mark), which Python does not read source in; save it as "
        "UTF-8 and migrate again")


def test_utf8_byte_order_mark_is_kept(capsys, tmp_path):
    path = tmp_path / "bom.py"
    path.write_bytes(b"\xef\xbb\xbf# \xc3\xa9\n" + LEGACY.encode())
    assert _run(capsys, tmp_path)[0] == 0
    assert path.read_bytes() == (b"\xef\xbb\xbf# \xc3\xa9\n"
                                 + MIGRATED.encode())


def test_pep263_coding_line_is_honoured(capsys, tmp_path):
    path = tmp_path / "cp.py"
    source = "#!/usr/bin/env python\n# vim: set fileencoding=cp1252 :\n" \
             "# \u20ac price\n" + LEGACY
    path.write_bytes(source.encode("cp1252"))
    assert _run(capsys, tmp_path)[0] == 0
    assert path.read_bytes().decode("cp1252") == (
        "#!/usr/bin/env python\n# vim: set fileencoding=cp1252 :\n"
        "# \u20ac price\n" + MIGRATED)


def test_unknown_coding_line(capsys, tree):
    bad = tree / "odd.py"
    bad.write_text("# -*- coding: klingon -*-\n" + LEGACY)
    code, _, err = _run(capsys, tree)
    assert code == 2
    assert len(_problems(err)) == 1
    assert _problems(err)[0].startswith(f"{bad}: cannot read: ")
    assert "klingon" in _problems(err)[0]
    assert (tree / "good.py").read_text() == MIGRATED


def test_dangling_link(capsys, tree):
    bad = tree / "gone.py"
    bad.symlink_to(tree / "nowhere.py")
    _assert_one_problem_and_the_rest_migrated(
        capsys, tree, bad, f": cannot read: a link to {tree / 'nowhere.py'}, "
        "which does not exist")


def test_dangling_link_named_on_the_command_line(capsys, tree):
    bad = tree / "gone.py"
    bad.symlink_to(tree / "nowhere.py")
    code, _, err = _run(capsys, bad, tree / "good.py")
    assert code == 2
    assert _problems(err)[0] == (f"{bad}: cannot read: a link to "
                                 f"{tree / 'nowhere.py'}, which does not "
                                 "exist")
    assert (tree / "good.py").read_text() == MIGRATED


def test_missing_path_does_not_stop_the_others(capsys, tree):
    code, _, err = _run(capsys, tree / "nope.py", tree)
    assert code == 2
    assert _problems(err) == [f"{tree / 'nope.py'}: no such file or folder"]
    assert (tree / "good.py").read_text() == MIGRATED


def test_folder_named_like_a_python_file_is_searched(capsys, tree):
    (tree / "pkg.py").mkdir()
    (tree / "pkg.py" / "inner.py").write_text(LEGACY)
    code, out, err = _run(capsys, tree)
    assert code == 0, err
    assert (tree / "pkg.py" / "inner.py").read_text() == MIGRATED
    assert sorted(out) == [f"wrote {tree / 'good.py'}",
                           f"wrote {tree / 'pkg.py' / 'inner.py'}"]


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX modes")
def test_read_only_file_is_reported_and_left(capsys, tree):
    bad = tree / "locked.py"
    bad.write_text(LEGACY)
    bad.chmod(stat.S_IRUSR | stat.S_IRGRP)
    try:
        _assert_one_problem_and_the_rest_migrated(
            capsys, tree, bad, ": cannot write: the file is read-only; nothing "
            "written")
        assert bad.read_text() == LEGACY
        assert stat.S_IMODE(bad.stat().st_mode) == stat.S_IRUSR | stat.S_IRGRP
    finally:
        bad.chmod(0o644)
    # Without --write nothing is written: the diff is printed, exit 0.
    bad.chmod(stat.S_IRUSR)
    try:
        code, out, _ = _run(capsys, bad, write=False)
        assert code == 0
        assert f"+++ b/{bad.as_posix()}" in out or f"+++ {bad}" in out
    finally:
        bad.chmod(0o644)


def test_syntax_error_names_pythons_line(capsys, tree):
    bad = tree / "broken.py"
    bad.write_text("import tensorflow as tf\n\n"
                   "ls = tf.train.experimental.DynamicLossScale(\n"
                   "x = 1\n")
    code, _, err = _run(capsys, tree)
    assert code == 2
    assert _problems(err) == [f"{bad}:3: cannot parse: '(' was never closed"]
    assert (tree / "good.py").read_text() == MIGRATED


def test_write_keeps_the_mode_and_leaves_no_temporary_file(capsys, tree):
    (tree / "good.py").chmod(0o751)
    assert _run(capsys, tree)[0] == 0
    assert stat.S_IMODE((tree / "good.py").stat().st_mode) == 0o751
    assert sorted(os.listdir(tree)) == ["good.py"]


def test_link_out_of_the_tree_is_not_followed(capsys, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "theirs.py").write_text(LEGACY)
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "good.py").write_text(LEGACY)
    (tree / "theirs.py").symlink_to(outside / "theirs.py")
    (tree / "lib").symlink_to(outside)
    code, out, err = _run(capsys, tree)
    assert code == 2
    assert _problems(err) == [
        f"{tree / 'theirs.py'}: not migrated: a link to "
        f"{(outside / 'theirs.py').resolve()}, outside the folders given; "
        "migrate that file itself"]
    assert f"migrate: 1 links to folders outside the tree not followed " \
           f"(migrate those folders themselves): {tree / 'lib'}" in err
    assert (outside / "theirs.py").read_text() == LEGACY
    assert out == [f"wrote {tree / 'good.py'}"]


def test_links_inside_the_tree_and_loops_migrate_each_file_once(capsys,
                                                               tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text(LEGACY)
    (tmp_path / "pkg" / "loop").symlink_to(tmp_path)
    (tmp_path / "alias.py").symlink_to(tmp_path / "pkg" / "a.py")
    code, out, err = _run(capsys, tmp_path)
    assert code == 0, err
    assert out == [f"wrote {tmp_path / 'pkg' / 'a.py'}"]
    assert (tmp_path / "pkg" / "a.py").read_text() == MIGRATED
    assert (tmp_path / "alias.py").is_symlink()


def test_cr_only_newlines_keep_the_last_one(capsys, tmp_path):
    path = tmp_path / "mac.py"
    path.write_bytes(LEGACY.replace("\n", "\r").encode())
    assert _run(capsys, tmp_path)[0] == 0
    assert path.read_bytes() == MIGRATED.replace("\n", "\r").encode()
    # A file the rewriter has nothing to change in is left byte for byte.
    text = "import tensorflow as tf\rloss_scale = 1\r"
    assert migrate.rewrite(text) == (text, [])


def test_second_run_changes_nothing_and_exits_0(capsys, tmp_path):
    (tmp_path / "compile.py").write_text(
        "import tensorflow as tf\n"
        "from tensorflow.keras.mixed_precision import experimental as mp\n"
        "mp.set_policy('mixed_float16' if FLAGS.amp else 'float32')\n"
        "opt = tf.keras.optimizers.get(name)\n"
        "model.compile(optimizer=opt, loss='mse')\n"
        "model.compile(loss='mse')\n")
    (tmp_path / "scaled.py").write_text(
        "import tensorflow as tf\n"
        "opt = tf.keras.mixed_precision.experimental.LossScaleOptimizer(\n"
        "    tf.keras.optimizers.SGD(), 'dynamic')\n"
        "loss = opt.get_scaled_loss(loss)\n"
        "grads = opt.get_unscaled_gradients(grads)\n"
        "value = opt.loss_scale()\n")
    (tmp_path / "unscaled.py").write_text(
        "import tensorflow as tf\n"
        "opt = tf.keras.mixed_precision.experimental.LossScaleOptimizer(\n"
        "    tf.keras.optimizers.SGD(), 'dynamic')\n"
        "opt.apply_gradients(grads)\n")
    first, out, err = _run(capsys, tmp_path)
    assert first == 0, err
    assert len(out) == 3
    written = {p.name: p.read_text() for p in tmp_path.iterdir()}
    code, out, err = _run(capsys, tmp_path)
    assert (code, out, _problems(err)) == (0, [], [])
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == written


def test_help_gives_examples_and_the_exit_status():
    from tf_lossscale import cli
    text = cli.build_parser("tf-lossscale")._subparsers._group_actions[
        0].choices["migrate"].format_help()
    assert "  tf-lossscale migrate --write src/ tests/\n" in text
    assert ("exit status:\n  0  everything was converted\n"
            "  1  something was left as it was") in text
    assert ("  2  a path does not exist, or a file could not be read, "
            "parsed or written:\n") in text


def _drain(master):
    """All a pseudo-terminal's other end wrote; closes it."""
    import select
    chunks = []
    while select.select([master], [], [], 0.5)[0]:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the other end is closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    return b"".join(chunks).decode()


@pytest.mark.skipif(sys.platform == "win32", reason="a pseudo-terminal")
def test_progress_only_on_a_terminal_and_only_for_large_trees(
        tmp_path, monkeypatch, capsys):
    for i in range(4):
        (tmp_path / f"m{i}.py").write_text("x = 1\n")
    monkeypatch.setattr(migrate, "PROGRESS_FROM", 3)
    # Not a terminal (pytest's capture): no progress line.
    assert migrate.run([str(tmp_path)], write=False) == 0
    assert "files\r" not in capsys.readouterr().err
    master, slave = os.openpty()
    with open(slave, "w") as terminal:
        monkeypatch.setattr(sys, "stderr", terminal)
        assert migrate.run([str(tmp_path)], write=False) == 0
    shown = _drain(master)
    assert "\rmigrate: 0/4 files\rmigrate: 1/4 files" in shown
    assert "migrate: 0 of 4 files parsed" in shown
    monkeypatch.setattr(migrate, "PROGRESS_FROM", 4)
    master, slave = os.openpty()
    with open(slave, "w") as terminal:
        monkeypatch.setattr(sys, "stderr", terminal)
        migrate.run([str(tmp_path)], write=False)
    shown = _drain(master)
    assert "/4 files" not in shown
