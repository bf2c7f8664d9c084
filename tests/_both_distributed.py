"""The LossScaleOptimizer under MirroredStrategy, on both Kerases.

Written once and run on each flavour (`tests/_flavours.py`):
`tests/test_keras_optimizer_distributed.py` runs these tests on Keras 3,
`tf_keras_cases/cases_distributed.py` on tf_keras, each in its own process
(tests/conftest.py makes the two logical CPUs and the one strategy of each).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from _flavours import replica_values


def test_apply_in_a_cross_replica_context_raises_and_changes_nothing(
        flavour, mirrored_strategy):
    with mirrored_strategy.scope():
        var = flavour.variable([1.0, 2.0])
        opt = flavour.wrap(flavour.optimizers.SGD(0.1, momentum=0.9),
                           initial_scale=8.0, dynamic_growth_steps=2)
        opt.build([var])
    with mirrored_strategy.scope():
        with pytest.raises(ValueError, match="replica context"):
            opt.apply_gradients([(tf.constant([1.0, 1.0]), var)])
    assert int(opt.iterations.numpy()) == 0
    assert float(opt.loss_scale.numpy()) == 8.0
    np.testing.assert_array_equal(replica_values(var), [[1.0, 2.0]] * 2)


# What a module of each side imports to run the tests above.
__all__ = [name for name in dir() if name.startswith("test_")]
