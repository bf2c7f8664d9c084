"""Keras 3's own LossScaleOptimizer tests, run against ours.

The test file ships in the installed keras package
(`keras/src/optimizers/loss_scale_optimizer_test.py`). It is loaded from
there at collection time as a private copy (Keras' own module is left
alone), and the name `LossScaleOptimizer` in that copy's namespace, the
only class its tests construct, is rebound to `tf_lossscale.LossScaleOptimizer`.
Its test class is then exposed here for pytest to collect. Nothing of Keras'
test code lives in this repository.

`DESELECT` and `XFAIL` are read by `conftest.py` (see its docstring).
Keras skips the `stateless` variants itself on the TensorFlow backend.
"""

import importlib.util
import sys

import keras
import pytest

import tf_lossscale

KERAS_TEST_MODULE = "keras.src.optimizers.loss_scale_optimizer_test"
_PRIVATE_NAME = "_keras3_loss_scale_optimizer_test_on_tf_lossscale"


def _load_keras_suite():
    spec = importlib.util.find_spec(KERAS_TEST_MODULE)
    if spec is None:
        # Of the Keras releases we support, only 3.15.1 ships its test files
        # in the wheel (3.9.2-3.15.0 do not): the newest CI row runs them.
        pytest.skip(f"keras {keras.__version__} ships no {KERAS_TEST_MODULE}"
                    "; CI's newest row (keras 3.15.1) runs it",
                    allow_module_level=True)
    origin = spec.origin
    spec = importlib.util.spec_from_file_location(_PRIVATE_NAME, origin)
    module = importlib.util.module_from_spec(spec)
    sys.modules[_PRIVATE_NAME] = module
    spec.loader.exec_module(module)
    # Fail loudly if Keras renames what we swap, rather than test Keras.
    if module.LossScaleOptimizer is not keras.mixed_precision.LossScaleOptimizer:
        raise RuntimeError(
            f"{origin} no longer binds LossScaleOptimizer to Keras' class; "
            "update the swap in tests/originals/test_keras3_own_suite.py.")
    module.LossScaleOptimizer = tf_lossscale.LossScaleOptimizer
    return module


KERAS_SUITE = _load_keras_suite()
LossScaleOptimizerTest = KERAS_SUITE.LossScaleOptimizerTest

DESELECT = {
    "test_init_dynamic_arg":
        "deliberate difference (docs/differences.md): the Keras 3 flavour has "
        "TensorFlow's dynamic=False; Keras 3 raises ValueError for it.",
    "test_serialization":
        "deliberate difference (docs/differences.md): the Keras 3 flavour has "
        "`dynamic` in its config, so get_config() has 5 keys, not Keras' 4.",
}

# Strict xfails for defects still open: {test name: (reason, exception)}.
# Every defect Keras' suite found is fixed, so none is open.
XFAIL: dict = {}


def test_keras_suite_constructs_ours():
    """The swap took: the Keras tests build tf_lossscale's class."""
    opt = KERAS_SUITE.LossScaleOptimizer(KERAS_SUITE.SGD(learning_rate=0.5))
    assert isinstance(opt, tf_lossscale.LossScaleOptimizer)
    assert type(opt).__module__.startswith("tf_lossscale.")
    assert type(opt) is not keras.mixed_precision.LossScaleOptimizer
    assert opt.initial_scale == 2.0 ** 15
    assert opt.dynamic_growth_steps == 2000
