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


def test_the_one_constructor_takes_its_knob_defaults_from_the_tables():
    """The constructor's keyword-only knobs are settings' tables, in order,
    with the same defaults: a knob added to a table and not to the one
    signature (or the other way round) fails here."""
    from tf_lossscale import settings
    from tf_lossscale.optimizer import LossScaleOptimizer
    parameters = inspect.signature(LossScaleOptimizer.__init__).parameters
    knobs = {name: p.default for name, p in parameters.items()
             if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert knobs == {**settings.KNOB_DEFAULTS, **settings.STOP_DEFAULTS}
    assert list(knobs) == list({**settings.KNOB_DEFAULTS,
                                **settings.STOP_DEFAULTS})
    # No flavour writes a constructor of its own.
    import keras
    flavour = type(tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD()))
    assert "_build" in vars(flavour)
    assert [c.__name__ for c in flavour.__mro__
            if "__init__" in vars(c) and c.__module__.startswith(
                "tf_lossscale")] == ["KerasLossScaleOptimizer",
                                     "LossScaleOptimizer"]
