"""Set-up for the tf_keras cases, which run in a process of their own.

`tests/_tf_keras_cases.py` runs each `cases_*.py` module here with
`python -m pytest` in a subprocess whose environment sets
`TF_USE_LEGACY_KERAS=1` before TensorFlow is imported (`tests/conftest.py`
imports it, and makes the two logical CPUs and the one `MirroredStrategy`
fixture the distributed cases use). The main run never collects these
modules: their names do not match `test_*.py`, and without the variable
they are ignored here as well. The `flavour` fixture here is tf_keras' one:
the tests a case module imports from `tests/_both_*.py` run on tf_keras.
"""

import os

import pytest

LEGACY_KERAS = os.environ.get("TF_USE_LEGACY_KERAS") == "1"

collect_ignore_glob = [] if LEGACY_KERAS else ["cases_*.py"]

if LEGACY_KERAS:
    from _autograph_rules import leave_tf_keras_unconverted
    leave_tf_keras_unconverted()  # TF 2.16 traces as later ones do


@pytest.fixture(scope="session")
def flavour():
    """tf_keras' flavour, for the tests written once for both Kerases
    (`tests/_flavours.py`): overrides tests/conftest.py's Keras 3 one."""
    import _flavours
    return _flavours.tf_keras()


@pytest.fixture
def mixed_float16():
    """tf_keras' global `mixed_float16` policy for one test."""
    import tf_keras
    tf_keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        yield
    finally:
        tf_keras.mixed_precision.set_global_policy("float32")
