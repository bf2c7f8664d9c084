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
then exits with 1. A file that cannot be read, parsed or written (an
encoding Python would refuse, a link to nothing, a syntax error, a read-only
file under `--write`) gets one `file: reason` line, the others are still
migrated, and the command exits with 2. A policy set in one file governs the `compile` of the
others (a run is one program): their optimizers are wrapped as that
policy had them wrapped, if mixed_float16 is in force when they run.
`--write` replaces each file whole
(a temporary file in its folder, then a rename) and names each file it
wrote on stdout. Neither imports TensorFlow.
"""

from __future__ import annotations

import ast
import bisect
import codecs
import difflib
import io
import os
import stat
import sys
import tempfile
import tokenize
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import libcst as cst

from tf_lossscale.compat import legacy_names as table
from tf_lossscale.compat.rewrite import (
    Note,
    Run,
    module_facts,
    rewrite,
    run_facts,
)
from tf_lossscale.compat.rewrite.compile_scaling import ALONE, Scaling

__all__ = ["Note", "PROGRESS_FROM", "line_map", "rewrite", "run"]

# A run over more files than this shows its progress on stderr, if that is
# a terminal.
PROGRESS_FROM = 300

# Byte-order marks of encodings in which Python cannot read source at all.
_WIDE_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"),
              (codecs.BOM_UTF16_LE, "UTF-16"), (codecs.BOM_UTF16_BE, "UTF-16"))


class _Unusable(Exception):
    """A file migrate cannot read, parse or write: `str(e)` is the
    `file: reason` (or `file:line: reason`) line for it."""


class _Files(NamedTuple):
    """What the paths given name: the .py files to migrate, the `file:
    reason` lines of those that cannot be, and folder links not followed."""

    files: List[Path]
    problems: List[str]
    links_not_followed: List[Path]


def _inside(path: Path, roots: Sequence[Path]) -> bool:
    return any(path == root or root in path.parents for root in roots)


def _walk(root: Path, roots: Sequence[Path], found: _Files) -> None:
    """Adds the .py files under `root`.

    A link to a folder is never followed (no loops; inside the tree its
    target is searched as itself, one outside it is listed); a link to a file is not migrated either: inside the
    tree its target is migrated under its own name, outside it the link
    gets a line, as does a link to nothing. A folder named `x.py` is a
    folder, searched like any other.
    """
    for folder, dirs, names in os.walk(root, followlinks=False):
        base = Path(folder)
        dirs.sort()
        found.links_not_followed.extend(
            base / d for d in dirs if (base / d).is_symlink()
            and not _inside((base / d).resolve(), roots))
        for name in sorted(names):
            path = base / name
            if not name.endswith(".py"):
                continue
            if not path.is_symlink():
                found.files.append(path)
                continue
            try:
                target = path.resolve(strict=True)
            except (OSError, RuntimeError):
                found.problems.append(
                    f"{path}: cannot read: a link to {os.readlink(path)}, "
                    "which does not exist")
                continue
            if not _inside(target, roots):
                found.problems.append(
                    f"{path}: not migrated: a link to {target}, outside the "
                    "folders given; migrate that file itself")


def _python_files(paths: Sequence[str]) -> _Files:
    """The .py files named by `paths`, folders searched recursively."""
    found = _Files([], [], [])
    roots = [Path(p).resolve() for p in paths if Path(p).is_dir()]
    for path in map(Path, paths):
        if path.is_dir():
            _walk(path, roots, found)
        elif path.is_file():
            found.files.append(path)
        elif path.is_symlink():
            found.problems.append(f"{path}: cannot read: a link to "
                                  f"{os.readlink(path)}, which does not exist")
        else:
            found.problems.append(f"{path}: no such file or folder")
    return found


def _read(path: Path) -> Tuple[str, str]:
    """The text of a Python file, newlines kept, and its encoding (by its
    byte-order mark or PEP 263 coding line, else UTF-8, as Python reads it).

    Raises:
      _Unusable: it cannot be read, or Python could not read it as source.
    """
    try:
        data = path.read_bytes()
    except OSError as e:
        raise _Unusable(f"{path}: cannot read: {e.strerror}") from None
    for bom, name in _WIDE_BOMS:
        if data.startswith(bom):
            raise _Unusable(
                f"{path}: cannot read: {name} (it starts with a {name} "
                "byte-order mark), which Python does not read source in; "
                "save it as UTF-8 and migrate again")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as e:
        # Also for bytes that are not UTF-8 on the first two lines.
        encoding, error = "utf-8", str(e)
    else:
        error = ""
    try:
        text = data.decode(encoding)
        if error:
            raise _Unusable(f"{path}: cannot read: {error}")
        return text, encoding
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise _Unusable(
            f"{path}:{line}: cannot read: byte 0x{data[e.start]:02x} is not "
            f"{encoding} and no coding line (PEP 263) names another "
            "encoding") from None


def _parse_error(path: Path, source: str, error: cst.ParserSyntaxError) -> str:
    """`file:line: cannot parse: why`, in Python's words where Python
    refuses the file too."""
    try:
        compile(source, str(path), "exec", ast.PyCF_ONLY_AST,
                dont_inherit=True)
    except SyntaxError as e:
        return f"{path}:{e.lineno}: cannot parse: {e.msg}"
    except ValueError as e:  # e.g. a NUL byte
        return f"{path}: cannot parse: {e}"
    message = " ".join(error.message.split())
    return (f"{path}:{error.raw_line}: cannot parse: Python reads it, the "
            f"rewriter's parser (libcst) does not: {message}")


def _write(path: Path, text: str, encoding: str) -> None:
    """Replaces the file with `text`, whole or not at all.

    Raises:
      _Unusable: it is read-only, or cannot be written; it is unchanged.
    """
    try:
        data = text.encode(encoding)
    except UnicodeEncodeError as e:
        raise _Unusable(f"{path}: cannot write: {text[e.start]!r} cannot "
                        f"be written in the file's encoding, {encoding}; "
                        "nothing written") from None
    target = path.resolve()  # A link named on the command line stays one.
    try:
        mode = stat.S_IMODE(target.stat().st_mode)
        if not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH) or (
                not os.access(target, os.W_OK)):
            raise PermissionError(0, "the file is read-only")
        fd, temporary = tempfile.mkstemp(
            prefix=f".{target.name}.", suffix=".migrate", dir=target.parent)
    except OSError as e:
        raise _Unusable(f"{path}: cannot write: {e.strerror}; nothing "
                        "written") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except OSError as e:
        os.unlink(temporary)
        raise _Unusable(f"{path}: cannot write: {e.strerror}; nothing "
                        "written") from None


def _diff(path: Path, source: str, new: str) -> List[str]:
    """A unified diff of one file (3 lines of context), named as git names
    files."""
    old_name, new_name = (str(path),) * 2 if path.is_absolute() else (
        f"a/{path.as_posix()}", f"b/{path.as_posix()}")
    a, b = source.splitlines(keepends=True), new.splitlines(keepends=True)
    matcher = _Matcher(a, b)
    lines: List[str] = []
    for group in matcher.get_grouped_opcodes(3):
        if not lines:
            lines += [f"--- {old_name}\n", f"+++ {new_name}\n"]
        first, last = group[0], group[-1]
        lines.append(f"@@ -{_range(first[1], last[2])} "
                     f"+{_range(first[3], last[4])} @@\n")
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                lines += [" " + line for line in a[i1:i2]]
                continue
            lines += ["-" + line for line in a[i1:i2]]
            lines += ["+" + line for line in b[j1:j2]]
    # A last line without a newline gets one in the diff, as difflib does.
    return [line if line.endswith(("\n", "\r")) else line + "\n"
            for line in lines]


def _range(start: int, stop: int) -> str:
    """A hunk's line range in unified diff notation."""
    length = stop - start
    if length == 1:
        return str(start + 1)
    return f"{start + 1 if length else start},{length}"


class _Matcher(difflib.SequenceMatcher[str]):
    """Matches the lines of a file and of its rewrite in linear time.

    difflib's own matching is quadratic in the worst case, and a large
    generated module (the same function a thousand times) is close to it:
    a 50,000-line file took longer to diff than to rewrite. The rewriter
    changes lines in place and adds some, so most lines that occur once in
    each text are the same line: they are matched first (the longest run of
    them in the same order, by patience sorting), and difflib matches only
    the short stretches between two of them.
    """

    def __init__(self, a: Sequence[str], b: Sequence[str]) -> None:
        super().__init__(None, a, b, autojunk=False)
        self._a, self._b = a, b
        self._blocks: Optional[List[difflib.Match]] = None

    def get_matching_blocks(self) -> List[difflib.Match]:
        if self._blocks is None:
            pairs: List[Tuple[int, int]] = []
            self._match(0, len(self._a), 0, len(self._b), pairs)
            blocks: List[List[int]] = []
            for i, j in pairs:
                if blocks and blocks[-1][0] + blocks[-1][2] == i and (
                        blocks[-1][1] + blocks[-1][2] == j):
                    blocks[-1][2] += 1
                else:
                    blocks.append([i, j, 1])
            self._blocks = [difflib.Match(*block) for block in blocks]
            self._blocks.append(difflib.Match(len(self._a), len(self._b), 0))
        return self._blocks

    def _match(self, alo: int, ahi: int, blo: int, bhi: int,
               pairs: List[Tuple[int, int]]) -> None:
        """Appends the matched line pairs of a[alo:ahi] and b[blo:bhi]."""
        a, b = self._a, self._b
        while alo < ahi and blo < bhi and a[alo] == b[blo]:
            pairs.append((alo, blo))
            alo, blo = alo + 1, blo + 1
        tail: List[Tuple[int, int]] = []
        while alo < ahi and blo < bhi and a[ahi - 1] == b[bhi - 1]:
            ahi, bhi = ahi - 1, bhi - 1
            tail.append((ahi, bhi))
        if alo < ahi and blo < bhi:
            anchors = _unique_common(a, alo, ahi, b, blo, bhi)
            if anchors:
                for i, j in anchors:
                    self._match(alo, i, blo, j, pairs)
                    pairs.append((i, j))
                    alo, blo = i + 1, j + 1
                self._match(alo, ahi, blo, bhi, pairs)
            elif (ahi - alo) * (bhi - blo) <= 250_000:
                inner = difflib.SequenceMatcher(
                    None, a[alo:ahi], b[blo:bhi], autojunk=False)
                for i, j, size in inner.get_matching_blocks():
                    pairs.extend((alo + i + k, blo + j + k)
                                 for k in range(size))
        pairs.extend(reversed(tail))


def _unique_common(a: Sequence[str], alo: int, ahi: int, b: Sequence[str],
                   blo: int, bhi: int) -> List[Tuple[int, int]]:
    """The longest sequence of lines that occur once in a[alo:ahi] and once
    in b[blo:bhi], in the same order in both: (index in a, index in b)."""
    count: Dict[str, int] = {}
    where: Dict[str, int] = {}
    for i in range(alo, ahi):
        count[a[i]] = count.get(a[i], 0) + 1
        where[a[i]] = i
    in_b: Dict[str, int] = {}
    for j in range(blo, bhi):
        if count.get(b[j]) == 1:
            in_b[b[j]] = -1 if b[j] in in_b else j
    pairs = sorted((where[line], j) for line, j in in_b.items() if j >= 0)
    # Longest increasing run of j (patience sorting).
    tops: List[int] = []
    top_index: List[int] = []
    previous: List[int] = []
    for k, (_, j) in enumerate(pairs):
        pile = bisect.bisect_left(tops, j)
        if pile == len(tops):
            tops.append(j)
            top_index.append(k)
        else:
            tops[pile] = j
            top_index[pile] = k
        previous.append(top_index[pile - 1] if pile else -1)
    run: List[Tuple[int, int]] = []
    k = top_index[-1] if top_index else -1
    while k >= 0:
        run.append(pairs[k])
        k = previous[k]
    return run[::-1]


def _run_facts(files: Sequence[Path]) -> Run:
    """What the files say about `compile` together: a policy set in one of
    them governs the `compile` of another. A file that cannot be read or
    parsed counts for nothing here (the migration reports it)."""
    found = []
    for path in files:
        try:
            source, _ = _read(path)
            if "compile" in source or table.may_hold_legacy_names(source):
                found.append(module_facts(source))
        except (_Unusable, SyntaxError, ValueError, RecursionError,
                cst.ParserSyntaxError):
            continue
    return run_facts(found)


def migrate_file(path: Path, write: bool,
                 run: Run = ALONE) -> Optional[List[str]]:
    """Rewrites one file, or prints its diff; returns its unconverted lines.

    Args:
      path: a Python file.
      write: replace it (same encoding and newlines) instead of printing a
        unified diff on stdout, and name it on stdout.
      run: what the other files of the run say about `compile`.

    Returns:
      `file:line: reason` for each thing left unconverted; None if the file
      was not parsed, its text holding no name the rewriter acts on
      (`legacy_names.may_hold_legacy_names`).

    Raises:
      _Unusable: the file cannot be read, parsed or written.
    """
    source, encoding = _read(path)
    if not table.may_hold_legacy_names(source) and not (
            run.scaling is not Scaling.NONE and "compile" in source):
        return None
    try:
        new, notes = rewrite(source, run)
    except cst.ParserSyntaxError as e:
        raise _Unusable(_parse_error(path, source, e)) from None
    except RecursionError:
        raise _Unusable(f"{path}: cannot parse: nested too deeply for the "
                        "rewriter") from None
    if new != source:
        if write:
            _write(path, new, encoding)
            print(f"wrote {path}", flush=True)
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
    for tag, i1, i2, j1, j2 in _Matcher(a, b).get_opcodes():
        for i in range(i1, i2):
            if tag == "equal":
                mapping[i + 1] = j1 + (i - i1) + 1
            else:
                mapping[i + 1] = max(j1, j2 - (i2 - i)) + 1
    mapping.setdefault(len(a) + 1, len(b) + 1)
    return mapping


def _progress(done: int, total: int) -> None:
    sys.stderr.write(f"\rmigrate: {done}/{total} files" if done < total
                     else "\r" + " " * (len(f"migrate: {total}/{total} "
                                             "files")) + "\r")
    sys.stderr.flush()


def run(paths: Sequence[str], write: bool) -> int:
    """The `migrate` command.

    Args:
      paths: Python files, or folders to search for them.
      write: rewrite the files in place instead of printing a unified diff.

    Returns:
      0 if everything was converted; 1 if something was left (each reported
      on stderr as `file:line: reason`); 2 if a path does not exist or a
      file could not be read, parsed or written (each reported as
      `file: reason`; every other file is still migrated).
    """
    found = _python_files(paths)
    files = found.files
    problems = list(found.problems)
    left: List[str] = []
    skipped = 0
    progress = len(files) > PROGRESS_FROM and sys.stderr.isatty()
    step = max(1, len(files) // 100)
    facts = _run_facts(files)
    for i, path in enumerate(files):
        if progress and i % step == 0:
            _progress(i, len(files))
        try:
            notes = migrate_file(path, write, facts)
        except _Unusable as e:
            problems.append(str(e))
            continue
        except Exception as e:  # A rewriter bug stops one file, not all.
            problems.append(f"{path}: cannot migrate: the rewriter failed "
                            f"({type(e).__name__}: {e}); please report it")
            continue
        if notes is None:
            skipped += 1
        else:
            left += notes
    if progress:
        _progress(len(files), len(files))
    for line in left + problems:
        print(line, file=sys.stderr)
    if skipped:
        print(f"migrate: {len(files) - skipped} of {len(files)} files parsed; "
              f"{skipped} skipped, their text holding none of "
              f"{', '.join(sorted(table.TEXT_NEEDLES))} (no loss scaling "
              "to migrate)", file=sys.stderr)
    if found.links_not_followed:
        print(f"migrate: {len(found.links_not_followed)} links to folders "
              "outside the tree not followed (migrate those folders "
              "themselves): "
              f"{', '.join(map(str, found.links_not_followed))}",
              file=sys.stderr)
    if problems:
        print(f"migrate: {len(problems)} files could not be migrated "
              "(listed above); the others were", file=sys.stderr)
        return 2
    return 1 if left else 0
