"""Process-wide test set-up.

Two logical CPU devices must exist before TensorFlow creates any tensor, so
that `MirroredStrategy(["/cpu:0", "/cpu:1"])` is real on one CPU; this runs
at collection time, before any test module builds a tensor. One strategy is
shared per process: several MirroredStrategy objects can clash on
collective keys.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    _cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

_MIRRORED = []


@pytest.fixture(scope="session")
def mirrored_strategy() -> tf.distribute.MirroredStrategy:
    """One MirroredStrategy over two logical CPUs, shared by the session."""
    if not _MIRRORED:
        _MIRRORED.append(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))
    return _MIRRORED[0]


@pytest.fixture(scope="session")
def flavour():
    """Keras 3's flavour, for the tests written once for both Kerases
    (`tests/_flavours.py`); tests/tf_keras_cases/conftest.py gives tf_keras'.
    """
    import _flavours  # Not before the logical CPUs above exist.
    return _flavours.keras3()
