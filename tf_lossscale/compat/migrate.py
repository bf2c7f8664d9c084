"""The `migrate` command: rewrites legacy loss-scaling code to the current API.

`python -m tf_lossscale migrate PATH...` turns TF 2.1-2.15 code into code
that runs on today's TensorFlow without the `tf_lossscale.compat` shim and
does what it did under the shim::

    from tensorflow.keras.mixed_precision import experimental as mp
    mp.set_policy("mixed_float16")
    opt = mp.LossScaleOptimizer(opt, loss_scale=123)
    ls = tf.train.experimental.DynamicLossScale(2048)

becomes::

    from tensorflow.keras import mixed_precision as mp
    import tf_lossscale
    mp.set_global_policy("mixed_float16")
    opt = tf_lossscale.LossScaleOptimizer(opt, dynamic=False, initial_scale=123)
    ls = tf_lossscale.DynamicLossScale(2048)

This module is the command line (files, diffs, exit code); the rules are in
`tf_lossscale.compat.rewrite`. What cannot be converted statically is
reported on stderr as `file:line: reason`, every occurrence, and the command
then exits with 1. Neither imports TensorFlow.
"""

from __future__ import annotations

import difflib
import sys
import tokenize
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import libcst as cst

from tf_lossscale.compat import legacy_names as table
from tf_lossscale.compat.rewrite import Note, rewrite

__all__ = ["Note", "line_map", "rewrite", "run"]


def _python_files(paths: Sequence[str]) -> List[Path]:
    """The .py files named by `paths`, folders searched recursively.

    Raises:
      FileNotFoundError: a path does not exist.
    """
    files: List[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            files += sorted(path.rglob("*.py"))
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"{path}: no such file or folder")
    return files


def _read(path: Path) -> Tuple[str, str]:
    """The text of a Python file, newlines kept, and its encoding."""
    with path.open("rb") as f:
        encoding, _ = tokenize.detect_encoding(f.readline)
    with path.open(encoding=encoding, newline="") as f:
        return f.read(), encoding


def _diff(path: Path, source: str, new: str) -> List[str]:
    """A unified diff of one file, named as git names files."""
    old_name, new_name = (str(path),) * 2 if path.is_absolute() else (
        f"a/{path.as_posix()}", f"b/{path.as_posix()}")
    return list(difflib.unified_diff(
        source.splitlines(keepends=True), new.splitlines(keepends=True),
        old_name, new_name))


def migrate_file(path: Path, write: bool) -> Optional[List[str]]:
    """Rewrites one file, or prints its diff; returns its unconverted lines.

    Args:
      path: a Python file.
      write: rewrite it in place (same encoding and newlines) instead of
        printing a unified diff on stdout.

    Returns:
      `file:line: reason` for each thing left unconverted; None if the file
      was not parsed, its text holding no name the rewriter acts on
      (`legacy_names.may_hold_legacy_names`).
    """
    source, encoding = _read(path)
    if not table.may_hold_legacy_names(source):
        return None
    try:
        new, notes = rewrite(source)
    except cst.ParserSyntaxError as e:
        return [f"{path}:{e.raw_line}: cannot parse: {e.message}"]
    if new != source:
        if write:
            with path.open("w", encoding=encoding, newline="") as f:
                f.write(new)
        else:
            sys.stdout.writelines(_diff(path, source, new))
    if not (write and new != source):
        return [f"{path}:{note.line}: {note.reason}" for note in notes]
    # The file on disk is the rewritten one: name its lines (imports added
    # above move everything down), and the line as it was read.
    lines = line_map(source, new)
    return [f"{path}:{lines[note.line]}: {note.reason} [line {note.line} "
            "before --write]" if lines[note.line] != note.line else
            f"{path}:{note.line}: {note.reason}" for note in notes]


def line_map(old: str, new: str) -> Dict[int, int]:
    """Line numbers (1-based) of `old` -> where that line is in `new`.

    Unchanged lines map exactly; a changed line maps into the block that
    replaced it, aligned to the block's end, since the rewriter adds
    statements before a line, not after.
    """
    a, b = old.splitlines(), new.splitlines()
    mapping: Dict[int, int] = {}
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        for i in range(i1, i2):
            if tag == "equal":
                mapping[i + 1] = j1 + (i - i1) + 1
            else:
                mapping[i + 1] = max(j1, j2 - (i2 - i)) + 1
    mapping.setdefault(len(a) + 1, len(b) + 1)
    return mapping


def run(paths: Sequence[str], write: bool) -> int:
    """The `migrate` command.

    Args:
      paths: Python files, or folders to search for them.
      write: rewrite the files in place instead of printing a unified diff.

    Returns:
      0 if everything was converted, 1 if something was left (each reported
      on stderr as `file:line: reason`), 2 if a path does not exist.
    """
    try:
        files = _python_files(paths)
    except FileNotFoundError as e:
        print(f"migrate: {e}", file=sys.stderr)
        return 2
    left: List[str] = []
    skipped = 0
    for path in files:
        notes = migrate_file(path, write)
        if notes is None:
            skipped += 1
        else:
            left += notes
    for line in left:
        print(line, file=sys.stderr)
    if skipped:
        print(f"migrate: {len(files) - skipped} of {len(files)} files parsed; "
              f"{skipped} skipped, their text holding none of "
              f"{', '.join(sorted(table.TEXT_NEEDLES))} (no loss scaling "
              "to migrate)", file=sys.stderr)
    return 1 if left else 0
