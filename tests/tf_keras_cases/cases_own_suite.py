"""What tf_keras' own LossScaleOptimizer tests check, on both tf_keras families.

`originals/tf_keras_suite.py` runs tf_keras' test file against our classes;
the behaviours it found missing are tested here, on ours and on tf_keras'
own classes side by side:

- bad input raises the exception type tf_keras raises, and the message holds
  tf_keras' own sentence (code and tests match it) as well as what was passed
  and what is accepted (docs/differences.md);
- a family's class called directly with the other family's optimizer raises
  `TypeError`, as tf_keras' `LossScaleOptimizer` / `LossScaleOptimizerV3` do,
  naming what was passed and the class to use; the optimizer stays wrappable.

Runs under TF_USE_LEGACY_KERAS=1 (see tests/_tf_keras_cases.py).
"""

import re

import pytest
import tensorflow as tf
import tf_keras
from tf_keras.src.mixed_precision import loss_scale_optimizer as tk_lso

import tf_lossscale
from tf_lossscale import tf_keras_legacy_optimizer, tf_keras_optimizer

OURS = tf_lossscale.LossScaleOptimizer
THEIRS = tf_keras.mixed_precision.LossScaleOptimizer
CURRENT = tf_keras_optimizer.TfKerasLossScaleOptimizer
LEGACY = tf_keras_legacy_optimizer.TfKerasLegacyLossScaleOptimizer
FAMILIES = {
    "current": tf_keras.optimizers.SGD,
    "legacy": tf_keras.optimizers.legacy.SGD,
}


def _error(make, *args, **kwargs):
    """The exception `make(*args, **kwargs)` raises (fails if none)."""
    with pytest.raises(Exception) as info:
        make(*args, **kwargs)
    return info.value


# Each case: keyword arguments, tf_keras' sentence (a regex), and what our
# message must also say (what was passed, what is accepted).
BAD_ARGUMENTS = {
    "dynamic_not_a_bool": (
        {"dynamic": "dynamic"},
        r'"dynamic" argument to LossScaleOptimizer\.__init__ must be a '
        r"bool, but got: 'dynamic'",
        ["of type str", "True for dynamic loss scaling",
         "tf_lossscale.experimental.LossScaleOptimizer"]),
    "fixed_without_initial_scale": (
        {"dynamic": False},
        r'"initial_scale" must be specified if "dynamic" is False',
        ["got None", "a number >= 1"]),
    "fixed_with_growth_steps": (
        {"dynamic": False, "initial_scale": 1, "dynamic_growth_steps": 2},
        r'"dynamic_growth_steps" must be None if "dynamic" is False, but '
        r"got: 2",
        ["a fixed scale never grows"]),
}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("case", BAD_ARGUMENTS)
def test_bad_arguments_raise_as_tf_keras_in_its_words_and_ours(family, case):
    kwargs, sentence, ours_also = BAD_ARGUMENTS[case]
    make_inner = FAMILIES[family]
    theirs = _error(THEIRS, make_inner(), **kwargs)
    ours = _error(OURS, make_inner(), **kwargs)
    assert type(ours) is type(theirs)
    assert re.search(sentence, str(theirs)), str(theirs)
    assert re.search(sentence, str(ours)), str(ours)
    for words in ours_also:
        assert words in str(ours), (words, str(ours))


@pytest.mark.parametrize("family", FAMILIES)
def test_an_inner_wrapped_twice_is_refused_in_tf_keras_words(family):
    sentence = r'"inner_optimizer" is already wrapped by a LossScaleOptimizer\.'
    for first in (OURS, THEIRS):
        inner = FAMILIES[family]()
        first(inner)
        theirs = _error(THEIRS, inner)
        ours = _error(OURS, inner)
        assert type(ours) is type(theirs) is ValueError
        assert re.search(sentence, str(theirs)) and re.search(sentence,
                                                              str(ours))
        assert repr(inner) in str(ours)
        assert "wrap a new optimizer" in str(ours)


@pytest.mark.parametrize("family", FAMILIES)
def test_central_storage_is_refused_in_tf_keras_words(family):
    sentence = (r"Loss scaling is not supported with the tf\.distribute\."
                r"Strategy: CentralStorageStrategy\. Try using a different "
                r"Strategy, e\.g\. a MirroredStrategy")
    strategy = tf.distribute.experimental.CentralStorageStrategy()
    make_inner = FAMILIES[family]
    with strategy.scope():
        theirs = _error(THEIRS, make_inner())
        ours = _error(OURS, make_inner())
    assert type(ours) is type(theirs) is ValueError
    assert re.search(sentence, str(theirs)) and re.search(sentence, str(ours))
    assert "OneDeviceStrategy" in str(ours)
    # Made outside the scope, refused at the step; nothing changes.
    opts = {"ours": OURS(make_inner()), "theirs": THEIRS(make_inner())}
    with strategy.scope():
        var = tf.Variable(1.0)
        for opt in opts.values():
            with pytest.raises(ValueError, match=sentence):
                strategy.run(lambda o=opt: o.minimize(lambda: var * 2.0,
                                                      [var]))
    assert float(var) == 1.0
    assert int(opts["ours"].iterations) == int(opts["theirs"].iterations) == 0


# (our class, tf_keras' class of the same family, the other family's
# optimizer, the class our message must name).
CROSSED = {
    "current_class_legacy_inner": (
        CURRENT, tk_lso.LossScaleOptimizerV3, tf_keras.optimizers.legacy.SGD,
        LEGACY, "only the optimizers subclassing from "
        "tf_keras.optimizers.Optimizer"),
    "legacy_class_current_inner": (
        LEGACY, tk_lso.LossScaleOptimizer, tf_keras.optimizers.SGD, CURRENT,
        "only the classic optimizers subclassing from "
        "`tf.keras.optimizers.Optimizer` can be passed"),
}


@pytest.mark.parametrize("case", CROSSED)
def test_a_family_class_refuses_the_other_family_as_tf_keras(case):
    ours_cls, theirs_cls, make_inner, right, accepted = CROSSED[case]
    inner = make_inner()
    theirs = _error(theirs_cls, make_inner())
    ours = _error(ours_cls, inner)
    assert type(ours) is type(theirs) is TypeError
    message = str(ours)
    assert accepted in message
    assert f"{type(inner).__module__}.{type(inner).__qualname__}" in message
    assert f"{right.__module__}.{right.__qualname__}" in message
    assert "Use tf_lossscale.LossScaleOptimizer" in message
    # Refused before anything was marked: the public class still wraps it,
    # in the right family's class, as tf_keras' public class does.
    opt = OURS(inner)
    assert type(opt) is right and opt.inner_optimizer is inner
    assert not isinstance(THEIRS(make_inner()), theirs_cls)


@pytest.mark.parametrize("case", CROSSED)
def test_a_deprecated_family_class_names_the_deprecated_public_class(case):
    ours_cls, _, make_inner, right, _ = CROSSED[case]
    twin = {CURRENT: tf_keras_optimizer.TfKerasExperimentalLossScaleOptimizer,
            LEGACY: tf_keras_legacy_optimizer
            .TfKerasLegacyExperimentalLossScaleOptimizer}[ours_cls]
    ours = _error(twin, make_inner(), "dynamic")
    assert type(ours) is TypeError
    assert twin.__name__ in str(ours)
    assert "Use tf_lossscale.experimental.LossScaleOptimizer" in str(ours)


@pytest.mark.parametrize("flavour", [CURRENT, LEGACY])
def test_a_family_class_given_no_optimizer_says_what_it_takes(flavour):
    theirs_cls = {CURRENT: tk_lso.LossScaleOptimizerV3,
                  LEGACY: tk_lso.LossScaleOptimizer}[flavour]
    theirs = _error(theirs_cls, 1)
    ours = _error(flavour, 1)
    assert type(ours) is type(theirs) is TypeError
    assert "Got 1 of type builtins.int" in str(ours)
    assert "can be passed" in str(ours)


@pytest.mark.parametrize("not_an_optimizer", [1, "sgd", None])
def test_a_non_optimizer_is_refused_in_tf_keras_words_and_ours(
        not_an_optimizer):
    theirs = _error(tk_lso.BaseLossScaleOptimizer, not_an_optimizer)
    ours = _error(OURS, not_an_optimizer)
    assert type(ours) is type(theirs) is TypeError
    sentence = (
        re.escape('"inner_optimizer" must be an instance of '
                  "`tf.keras.optimizers.Optimizer` or "
                  "`tf.keras.optimizers.experimental.Optimizer`, but got: ")
        + re.escape(str(not_an_optimizer)))
    assert re.match(sentence, str(theirs)), str(theirs)
    assert re.match(sentence, str(ours)), str(ours)
    assert f"got {not_an_optimizer!r} of type" in str(ours)
    assert "tf_keras.optimizers.legacy.Optimizer" in str(ours)
