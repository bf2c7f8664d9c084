"""docs/errors.md is a page a user can find an error on and fix it.

`tests/test_bad_input.py` runs every call in the page's tables; this module
checks the page's shape: each kind of bad input has one heading of its own
(with a fixed anchor, so it can be linked), the heading says the cause, the
fix and what the original does, and every row under a heading is of that
heading's kind.
"""

import re
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "errors.md"
HEADING = re.compile(r"^### (?P<title>.+?) \{#(?P<anchor>[a-z0-9-]+)\}$")


def sections() -> Dict[str, List[str]]:
    """Anchor -> the lines under its `###` heading."""
    found: Dict[str, List[str]] = {}
    current = None
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        match = HEADING.match(line)
        if match:
            current = match.group("anchor")
            assert current not in found, f"anchor {current} twice"
            found[current] = []
        elif line.startswith("## "):
            current = None
        elif current is not None:
            found[current].append(line)
    return found


def kinds(lines: List[str]) -> List[str]:
    rows = [[c.strip() for c in line.strip().strip("|").split(" | ")]
            for line in lines if line.startswith("| ")]
    return [cells[0] for cells in rows
            if len(cells) == 4 and cells[1].startswith("`")]


def test_each_kind_of_bad_input_has_one_linkable_section():
    found = sections()
    assert len(found) >= 30
    seen: Dict[str, str] = {}
    for anchor, lines in found.items():
        text = "\n".join(lines)
        for part in ("**Cause.** ", "**Fix.** ", "**The original.** "):
            assert text.count(part) == 1, (anchor, part)
        for kind in set(kinds(lines)):
            assert kind not in seen, (
                f"rows of {kind!r} under #{seen.get(kind)} and #{anchor}")
            seen[kind] = anchor
    every_row = kinds(PAGE.read_text(encoding="utf-8").splitlines())
    assert len(every_row) >= 78 and set(every_row) == set(seen)


def test_the_errors_users_meet_in_training_have_a_section():
    assert "skip-streak" in sections()
