"""The tf_keras flavour of LossScaleOptimizer, tested in processes of its own
(`tests/_tf_keras_cases.py` says why); this file runs the first group of
`tests/tf_keras_cases/`, test_tf_keras_optimizer_distributed.py and
test_tf_keras_optimizer_legacy.py the others.
"""

import _tf_keras_cases as cases
import pytest


def test_every_case_module_is_in_one_group():
    found = sorted(p.stem for p in cases.CASES.glob("cases_*.py"))
    grouped = [name for names in cases.GROUPS.values() for name in names]
    assert sorted(grouped) == found
    assert {"cases_optimizer", "cases_distributed", "cases_saving"} <= set(
        found)


@pytest.mark.parametrize("module", cases.modules("optimizer"),
                         ids=lambda p: p.stem)
def test_tf_keras_cases_pass_under_legacy_keras(module):
    cases.run_case_module(module)
