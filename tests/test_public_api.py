"""Pins the public import surface declared in tf_lossscale/__init__.py."""

import tf_lossscale

EXPECTED = [
    "DynamicLossScale",
    "FixedLossScale",
    "LossScale",
    "LossScaleOptimizer",
    "MixedPrecisionLossScaleOptimizer",
    "deserialize",
    "experimental",
    "get",
    "serialize",
]


def test_all_is_the_documented_list():
    assert sorted(tf_lossscale.__all__) == sorted(EXPECTED)


def test_every_public_name_imports():
    for name in tf_lossscale.__all__:
        assert getattr(tf_lossscale, name) is not None, name
