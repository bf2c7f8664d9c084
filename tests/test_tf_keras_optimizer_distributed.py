"""The tf_keras flavour in processes of its own: the "distributed" group of
`tests/tf_keras_cases/` (`tests/_tf_keras_cases.py`)."""

import _tf_keras_cases as cases
import pytest


@pytest.mark.parametrize("module", cases.modules("distributed"), ids=lambda p: p.stem)
def test_tf_keras_cases_pass_under_legacy_keras(module):
    cases.run_case_module(module)
