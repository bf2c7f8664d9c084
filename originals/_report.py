"""What the three runners of the originals' test files share.

Each runner (`tf_keras_suite.py`, `tensorflow_suite.py`,
`tf24_keras_suite.py`) runs an original test file under pytest twice, once
on the original classes and once on ours, and keeps only what is its own:
how it swaps the classes, its aliases for moved TensorFlow modules, its
`VERDICTS` table and its options. This module holds the rest, so that the
three report alike: running pytest in a child process and reading its
per-test outcomes from a junit xml, counting them, classifying the failures
on ours, and printing the report, whose exit status is the same rule for
all three.

The classifications of a failure on ours:

- `deliberate`: ours behaves otherwise on purpose (a documented decision);
- `private`: the test reaches a private name or class of the original;
- `message`: same exception class, the test's regex does not match ours;
- `unsupported`: what the test builds is outside what tf_lossscale
  supports (a decision, listed once with its count);
- `defect`: ours is wrong;
- `UNCLASSIFIED`: in no table: someone has to look.

`deliberate`, `private` and `message` are forgiven in the last count;
`defect` and `UNCLASSIFIED` make the runner exit 1; `unsupported` does
neither.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import types
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import (
    Any,
    Callable,
    Dict,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
)

HERE = pathlib.Path(__file__).resolve().parent

# (classification, why) of a failure on ours.
Verdict = Tuple[str, str]
UNCLASSIFIED: Verdict = ("UNCLASSIFIED", "")
FORGIVEN = frozenset({"deliberate", "private", "message"})
FAILING = frozenset({"defect", "UNCLASSIFIED"})  # exit status 1.
GROUPED = frozenset({"unsupported"})  # one line per reason, with its count.
_INDENT = "\n      "


@dataclass(frozen=True)
class Outcome:
    """One test's result: `status` is "passed", "failed" or "skipped"
    (an error counts as failed); `message` is the traceback, then junit's
    message attribute (which junit truncates, hence the traceback first)."""

    name: str
    status: str
    message: str


def parse_junit(xml: pathlib.Path, qualified: bool = False
                ) -> Dict[str, Outcome]:
    """Reads a pytest junit xml into outcomes by test name.

    With `qualified` a test's name is "Class.test" (the last part of its
    junit classname, then its name), for files with several test classes.
    A name reported more than once (a test's subtests) fails if any report
    fails, and is skipped only if every report is skipped.
    """
    outcomes: Dict[str, Outcome] = {}
    for case in ET.parse(xml).iter("testcase"):
        name = case.get("name", "")
        if qualified:
            name = f"{case.get('classname', '').rsplit('.', 1)[-1]}.{name}"
        status, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                status = "skipped" if child.tag == "skipped" else "failed"
                message = (child.text or "") + "\n" + (
                    child.get("message") or "")
        seen = outcomes.get(name)
        if seen is not None and (seen.status == "failed" or (
                seen.status == "passed" and status == "skipped")):
            continue
        outcomes[name] = Outcome(name, status, message)
    return outcomes


def run_pytest(argv: Sequence[str], env: Mapping[str, str], what: str,
               cwd: Optional[pathlib.Path] = None, qualified: bool = False
               ) -> Dict[str, Outcome]:
    """Runs `python ARGV --junitxml=XML` in a child process; returns the
    outcomes parsed from XML (see `parse_junit`).

    A child process per run, since a run swaps classes in its own process
    and TensorFlow's global state (v1 behaviour, loaded Keras) cannot be
    undone. `cwd` defaults to the run's temporary folder, so no run leaves
    anything in the repository. `what` names the run in the error raised
    when pytest wrote no report (the child's output tail is in it).
    """
    with tempfile.TemporaryDirectory() as tmp:
        xml = pathlib.Path(tmp) / "junit.xml"
        result = subprocess.run(
            [sys.executable, *argv, f"--junitxml={xml}"], env=dict(env),
            cwd=cwd or tmp, capture_output=True, text=True, check=False)
        if not xml.exists():
            raise RuntimeError(
                f"pytest wrote no report for the {what} run:\n"
                f"{result.stdout[-3000:]}{result.stderr[-3000:]}")
        return parse_junit(xml, qualified)


def run_plugin_suite(plugin: str, test_file: pathlib.Path, swap_env: str,
                     swap: str, k: Optional[str] = None, **env: str
                     ) -> Dict[str, Outcome]:
    """Runs `test_file` under pytest with the runner module `plugin` of this
    folder as its plugin (`-p PLUGIN`); returns outcomes by test name.

    The plugin reads the run's swap ("original", "ours", ...) from the
    environment variable `swap_env`; `env` adds variables (such as
    TF_USE_LEGACY_KERAS); `k` is pytest's -k expression.
    """
    path = os.pathsep.join(filter(None, [str(HERE),
                                         os.environ.get("PYTHONPATH")]))
    environ = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=path,
                   **{swap_env: swap}, **env)
    return run_pytest(
        ["-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-p", plugin,
         "-o",
         "junit_logging=no", *(["-k", k] if k else []), str(test_file)],
        environ, what=swap)


def collected_modules(items: Sequence[Any]) -> List[types.ModuleType]:
    """The test modules of pytest's collected items, each once: where a
    runner's plugin rebinds the names of the classes under test (after
    collection, before any test runs)."""
    modules: Dict[int, types.ModuleType] = {}
    for item in items:
        module = getattr(item, "module", None)
        if module is not None:
            modules.setdefault(id(module), module)
    return list(modules.values())


def parse_args(doc: str, argv: Optional[Sequence[str]],
               flags: Mapping[str, str],
               default_file: Optional[pathlib.Path] = None
               ) -> argparse.Namespace:
    """Parses a runner's command line: `--verbose` (print every failure's
    message), the runner's own on/off `flags` (option -> help) and, for a
    runner of one test file (`default_file`), `--file` (the saved original)
    and `-k` (pytest's). A missing test file is a usage error: it is never
    committed, the runner's docstring says where to fetch it."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    if default_file is not None:
        parser.add_argument("--file", type=pathlib.Path, default=default_file,
                            help="the original test file (default: "
                            "%(default)s)")
        parser.add_argument("-k", default=None, help="pytest -k expression")
    for flag, help_text in flags.items():
        parser.add_argument(flag, action="store_true", help=help_text)
    parser.add_argument("--verbose", action="store_true",
                        help="print each failure's message")
    args = parser.parse_args(argv)
    if default_file is not None and not args.file.exists():
        parser.error(f"{args.file} is missing; see the runner's docstring "
                     "or originals/README.md")
    return args


def lookup(name: str, verdicts: Mapping[str, Verdict]) -> Verdict:
    """The verdict of the longest key that is `name` or begins it followed
    by "_" (parameterized tests append their parameters after a "_", so
    the key `testDir` covers `testDir_test_mode_eager`, not `testDirV1`)."""
    for key in sorted(verdicts, key=len, reverse=True):
        if name == key or name.startswith(key + "_"):
            return verdicts[key]
    return UNCLASSIFIED


def counts(outcomes: Mapping[str, Outcome]) -> Tuple[int, int]:
    """(passed, run): skipped tests (GPU-only ones, ones the original file
    skips itself, helpers pytest collects) are not counted at all."""
    run = [o for o in outcomes.values() if o.status != "skipped"]
    return sum(o.status == "passed" for o in run), len(run)


def regex_mismatch(message: str) -> str:
    """The expected regex and our message of an assertRaisesRegex failure,
    as two indented lines (empty if the message is not one): what a
    `message` verdict rests on, shown so a reader can check it."""
    found = re.search(r'AssertionError: "(.*?)" does not match "(.*?)"\n',
                      message, re.S)
    if not found:
        return ""
    return (f"{_INDENT}expected regex: {found.group(1)}"
            f"{_INDENT}ours: {found.group(2)}")


def error_text(message: str) -> str:
    """The exception of a failure: pytest's `E` lines of the traceback
    (the whole message if it has none), at most 1,500 characters, the end
    kept: the head of a traceback is the test harness, not the error."""
    lines = [line[1:].strip() for line in message.splitlines()
             if line.startswith("E ")]
    text = "\n".join(lines) if lines else message.strip()
    return text if len(text) <= 1500 else "..." + text[-1500:]


def _indented(text: str) -> str:
    """`text` indented under a report line."""
    return _INDENT[1:] + text.replace("\n", _INDENT)


def print_report(original: Mapping[str, Outcome],
                 ours: Mapping[str, Outcome],
                 classify: Callable[[Outcome], Verdict], *,
                 original_label: str, original_short: str, skipped_note: str,
                 verbose: bool = False) -> int:
    """Prints both counts, every failure on ours with its verdict, and the
    count with deliberate/private/message failures forgiven; returns the
    exit status: 1 if any failure on ours is a defect or UNCLASSIFIED.

    `original_label` names the original classes in the count line,
    `original_short` in the note on a test that fails there too. A reason
    given twice is printed once, then "as <first test>"; `unsupported`
    failures are one line per reason with their count. An UNCLASSIFIED
    failure's message is printed always, any other's with `verbose`.
    """
    ours_label = "tf_lossscale"
    width = max(len(original_label), len(ours_label)) + 1
    print(f"tests run, skipped ones not counted ({skipped_note})")
    print("%s %d/%d passed" % ((f"on {original_label}:".ljust(width + 3),)
                               + counts(original)))
    print("%s %d/%d passed" % ((f"on {ours_label}:".ljust(width + 3),)
                               + counts(ours)))
    forgiven, status = 0, 0
    said: Dict[str, str] = {}  # why -> the first test it was said of.
    grouped: Dict[Verdict, List[str]] = {}
    for name, outcome in sorted(ours.items()):
        if outcome.status != "failed":
            continue
        kind, why = classify(outcome)
        forgiven += kind in FORGIVEN
        status |= kind in FAILING
        if kind in GROUPED:
            grouped.setdefault((kind, why), []).append(name)
            continue
        if why and why in said:
            why = f"as {said[why]}"
        else:
            said[why] = name
        theirs = original.get(name)
        note = "" if theirs is None or theirs.status == "passed" \
            else f" (on {original_short}: {theirs.status})"
        detail = regex_mismatch(outcome.message) if kind == "message" else ""
        print(f"  {kind:12} {name}{note}: {why}{detail}")
        if verbose or kind == "UNCLASSIFIED":
            print(_indented(error_text(outcome.message)))
    for (kind, why), names in grouped.items():
        print(f"  {kind:12} {len(names)} tests ({names[0]}, ...): {why}")
        if verbose:
            print("".join(f"{_INDENT[1:]}{name}\n" for name in names), end="")
    passed, run = counts(ours)
    print("on %s, deliberate/private/message forgiven: %d/%d"
          % (ours_label, passed + forgiven, run))
    return status
