"""Deselection and expected failures for the originals' own test suites.

A test module here loads an original's test file from its installed
package, swaps the class under test for ours, and declares two tables,
each keyed by pytest's test name (`item.name`, parameter suffix included)
and giving the reason:

- `DESELECT`: tests of one of docs/differences.md's deliberate differences.
  They are not run (pytest reports them as deselected).
- `XFAIL`: tests that fail today because of a defect of ours, named in
  the reason. They run as `xfail(strict=True, raises=...)`: the mark only
  absorbs the failure the defect causes, and the run turns red as soon as
  the test passes, so the entry must be removed with the fix. The value is
  `(reason, exception type the defect raises)`.
"""

import pathlib

import pytest

HERE = pathlib.Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    kept, deselected = [], []
    for item in items:
        if HERE not in pathlib.Path(item.path).resolve().parents:
            kept.append(item)
            continue
        module = getattr(item, "module", None)
        deselect = getattr(module, "DESELECT", {})
        xfail = getattr(module, "XFAIL", {})
        if item.name in deselect:
            deselected.append(item)
            continue
        if item.name in xfail:
            reason, raises = xfail[item.name]
            item.add_marker(
                pytest.mark.xfail(strict=True, raises=raises, reason=reason))
        kept.append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept
