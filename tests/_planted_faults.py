"""A 20-layer model with faults planted in known layers' gradients.

Shared by the Keras 3 tests (`test_skip_record.py`) and the tf_keras case
(`tf_keras_cases/cases_skip_record.py`): `build(keras)` takes either Keras.
Each `Hooked` layer multiplies its kernel's gradient by its `fault` weight
(1 normally): 65504 (the largest float16) makes it overflow to Inf at any
scale >= 1 once the scaled gradient exceeds 1, NaN makes it NaN at every
scale. `Planter` sets the faults batch by batch in `fit`.
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

import numpy as np
import tensorflow as tf

LAYERS = 20
OVERFLOW_LAYER, NAN_LAYER = 7, 13
OVERFLOW_STEP = 2
NAN_STEPS = (5, 6, 7, 8)
BATCHES, BATCH = 10, 8
# Seeded: unseeded, a model now and then overflowed float16 at the initial
# scale by itself (a product of 20 random kernels is heavy-tailed; in 60
# fault-free runs the largest scaled gradient ranged from 585 to 20640), and
# the monitor then rightly named layer_19, not the planted layers. With these
# seeds it is 1234 on both Kerases, and the model trains without a skip at 16
# times the initial scale (checked in `_both_skip_record.py`).
SEED = 1000


@tf.custom_gradient
def _hook(kernel: tf.Tensor, fault: tf.Tensor) -> Any:
    def grad(upstream: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
        return upstream * tf.cast(fault, upstream.dtype), tf.zeros_like(fault)
    return tf.identity(kernel), grad


def build(keras: Any) -> Tuple[Any, Any]:
    """The model (layers `layer_0` .. `layer_19`) and a `Planter`."""

    class Hooked(keras.layers.Layer):
        def __init__(self, index: int) -> None:
            super().__init__(name=f"layer_{index}")
            self.index = index

        def build(self, input_shape: Any) -> None:
            self.kernel = self.add_weight(
                name="kernel", shape=(int(input_shape[-1]), 8),
                initializer=keras.initializers.GlorotUniform(
                    seed=SEED + self.index))
            self.bias = self.add_weight(name="bias", shape=(8,),
                                        initializer="zeros")
            self.fault = self.add_weight(name="fault", shape=(),
                                         initializer="ones", trainable=False)

        def call(self, x: Any) -> Any:
            kernel = _hook(tf.cast(self.kernel, x.dtype),
                           tf.cast(self.fault, x.dtype))
            return tf.matmul(x, kernel) + tf.cast(self.bias, x.dtype)

    class Planter(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch: int,
                                 logs: Dict[str, Any] = None) -> None:
            for i, value in ((OVERFLOW_LAYER, 65504.0 if batch ==
                              OVERFLOW_STEP else 1.0),
                             (NAN_LAYER, np.nan if batch in NAN_STEPS
                              else 1.0)):
                self.model.get_layer(f"layer_{i}").fault.assign(value)

    layers = [keras.Input((4,))] + [Hooked(i) for i in range(LAYERS)]
    layers.append(keras.layers.Dense(
        1, dtype="float32", name="out",
        kernel_initializer=keras.initializers.GlorotUniform(
            seed=SEED + LAYERS)))
    return keras.Sequential(layers, name="net"), Planter()


def data() -> Tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCHES * BATCH, 4)).astype("float32")
    return x, x.sum(axis=1, keepdims=True)


# The optimizer's scale: it starts at 2**8, and its floor is 2**5.
INITIAL_SCALE, MIN_SCALE = 2.0**8, 2.0**5


def expected_lines(prefix: str) -> list:
    """The lines the monitor prints in this run (42 gradients: 20 kernels,
    20 biases, the output layer's two). `prefix`: what a variable's path
    starts with (Keras 3: the model's name and a slash; tf_keras: none)."""
    return [
        "step 2 skipped on replica 0: Inf entered at "
        f"{prefix}layer_7 in the backward pass (the loss was finite); 1 of "
        f"42 gradients non-finite: {prefix}layer_7/kernel; scale 2^8 -> 2^7",
        "step 5 skipped on replica 0: NaN entered at "
        f"{prefix}layer_13 in the backward pass (the loss was finite; "
        "float16 overflow can leave NaN here); 1 of 42 gradients "
        f"non-finite: {prefix}layer_13/kernel; scale 2^7 -> 2^6",
        "steps 5-7: 3 skipped in a row, the last at min_scale (2^5): the "
        "loss was finite and the gradients are still non-finite at the "
        "smallest scale: not float16 overflow but a real NaN in the "
        "backward pass (the gradient of a log, sqrt or division at zero, a "
        "diverging learning rate); last: NaN entered at "
        f"{prefix}layer_13 in the backward pass (the loss was finite); 1 of "
        f"42 gradients non-finite: {prefix}layer_13/kernel",
    ]
