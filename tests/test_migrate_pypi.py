"""`migrate` over Model Garden as published on PyPI (issue 33, item 5), a
test CI runs: `tf-models-official`'s wheels of 2.13.2 (TF 2.13's Model
Garden) and 2.3.0 (TF 2.3's, the experimental mixed-precision API), every
`.py` file of each, migrated with `--write` in a temporary folder: no
crash, the exit code, the files written and each reported `file:line` as
listed here, every written file compiles, and a second run changes nothing.

The wheels are downloaded by `tests/_pypi_wheels.py` (cached, never
committed; a failed download fails the test under CI, skips it elsewhere). tests/test_migrate_repository.py runs the same
checks over whole git snapshots of tensorflow/models where there is one.
"""

import pytest
from _migrate_tree import check_migrated_tree
from _pypi_wheels import python_files, wheel

PACKAGE = "tf-models-official"

# version -> (.py files in the wheel, exit code, files written, the
# reported `file:line`s of the first run, how many the second run reports:
# not the graph rewrite left as the shim's function, which runs as
# TensorFlow's did).
EXPECTED = {
    # TF 2.13's Model Garden: official/, orbit/, tensorflow_models/.
    "2.13.2": (1103, 0, 20, [], 0),
    # TF 2.3's (official/ only): the experimental policy API and the
    # graph rewrite, some of it beyond what can be converted safely.
    "2.3.0": (347, 1, 25, [
        "official/modeling/performance.py:38",
        "official/modeling/performance.py:46",
        "official/recommendation/ncf_keras_main.py:226",
        "official/recommendation/ncf_keras_main.py:295",
        "official/recommendation/ncf_keras_main.py:310",
    ], 4),
}


@pytest.mark.slow
@pytest.mark.parametrize("version", sorted(EXPECTED))
def test_model_garden_from_pypi_is_migrated(version, tmp_path, capsys,
                                            monkeypatch):
    files, code, written, reported, again = EXPECTED[version]
    assert python_files(wheel(PACKAGE, version), tmp_path) == files
    monkeypatch.chdir(tmp_path)
    check_migrated_tree(tmp_path, capsys, code, written, reported, again)
