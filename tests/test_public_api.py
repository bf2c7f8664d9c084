"""Pins the public import surface declared in tf_lossscale/__init__.py."""

import inspect

import tf_lossscale

EXPECTED = [
    "DynamicLossScale",
    "FixedLossScale",
    "LossScale",
    "LossScaleMonitor",  # docs/scaling-policy.md
    "LossScaleOptimizer",
    "MixedPrecisionLossScaleOptimizer",
    "SkipRecord",  # why a step was skipped (optimizer.last_skip)
    "SkipStreakError",  # max_consecutive_skips
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


def test_the_optimizer_shows_its_real_signature():
    parameters = inspect.signature(tf_lossscale.LossScaleOptimizer).parameters
    assert list(parameters) == [
        "inner_optimizer", "dynamic", "initial_scale", "dynamic_growth_steps",
        "min_scale", "max_scale", "growth_factor", "backoff_factor",
        "hysteresis", "max_consecutive_skips", "save_telemetry"]
    assert parameters["dynamic"].default is True
    assert parameters["min_scale"].kind is inspect.Parameter.KEYWORD_ONLY
    experimental = inspect.signature(
        tf_lossscale.experimental.LossScaleOptimizer).parameters
    assert list(experimental) == ["optimizer", "loss_scale", "name"]
