"""A Keras 3 model with Dropout, its step compiled whole by XLA.

Dropout draws its mask with a random-bit generator that XLA keeps as a
call of its own. One dynamic size anywhere in the step (XLA's TopK makes
one) makes XLA inline every call, and the inlined generator cost a step 1.5
to 4 times Keras' own wrapper's (issue 32). So the compiled step must hold
no dynamic size and keep as many calls as the same step with Keras' own
wrapper; and a skipped step must change no variable and no slot, while the
Dropout layers' seed state advances as with Keras' own wrapper (the forward
pass ran: the seed state is the model's, not the optimizer's).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Dict, List, Tuple

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_lossscale

_OPTIMIZERS: Dict[str, Callable[[], Any]] = {
    "sgd": lambda: keras.optimizers.SGD(0.01, momentum=0.9),
    "adam": lambda: keras.optimizers.Adam(1e-3),
    "adamw": lambda: keras.optimizers.AdamW(1e-3),
}


def _model(wrap: Callable[[Any], Any], inner: str) -> keras.Model:
    """Two blocks of Dense + Dropout + LayerNormalization, mixed_float16."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8,))
    x = inputs
    for _ in range(2):
        x = keras.layers.Dense(8, dtype="mixed_float16")(x)
        x = keras.layers.Dropout(0.1, dtype="mixed_float16")(x)
        x = keras.layers.LayerNormalization(dtype="mixed_float16")(x)
    outputs = keras.layers.Dense(1)(x)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=wrap(_OPTIMIZERS[inner]()), loss="mse",
                  jit_compile=True)
    model.optimizer.build(model.trainable_variables)
    return model


def _ours(inner: Any) -> Any:
    return tf_lossscale.LossScaleOptimizer(inner)


def _keras_own(inner: Any) -> Any:
    return keras.mixed_precision.LossScaleOptimizer(inner)


def _data(nan: bool = False) -> Tuple[tf.Tensor, tf.Tensor]:
    x = np.linspace(-1.0, 1.0, 4 * 8, dtype="float32").reshape(4, 8)
    if nan:
        x[0, 0] = np.nan
    return tf.constant(x), tf.constant(np.ones((4, 1), "float32"))


def _hlo(model: keras.Model, stage: str) -> str:
    step = tf.function(model.train_step, jit_compile=True)
    return step.experimental_get_compiler_ir(_data())(stage=stage)


def _calls(hlo: str) -> int:
    return len(re.findall(r"= \([^=]*\) call\(", hlo))


@pytest.mark.parametrize("inner", ["sgd", "adamw"])
def test_compiled_step_has_no_dynamic_size_and_keeps_the_random_calls(
        inner: str) -> None:
    ours = _model(_ours, inner)
    # Before the fix: two set-dimension-size (the skip record's TopK).
    assert "set-dimension-size" not in _hlo(ours, "hlo")
    assert "TopK" not in _hlo(ours, "hlo")
    optimized = _hlo(ours, "optimized_hlo")
    keras_own = _hlo(_model(_keras_own, inner), "optimized_hlo")
    # Before the fix: 0 calls (inlined) against Keras' 2, one per Dropout.
    assert _calls(keras_own) == 2
    assert _calls(optimized) == _calls(keras_own)


def _seed_states(model: keras.Model) -> List[np.ndarray]:
    return [keras.ops.convert_to_numpy(layer.seed_generator.state) for layer in model.layers
            if isinstance(layer, keras.layers.Dropout)]


def _slots(optimizer: Any) -> List[np.ndarray]:
    """The inner optimizer's variables but its step counter."""
    inner = optimizer.inner_optimizer
    return [keras.ops.convert_to_numpy(v) for v in inner.variables
            if v is not inner.iterations]


@pytest.mark.parametrize("inner", sorted(_OPTIMIZERS))
def test_a_skipped_dropout_step_changes_no_variable_nor_slot(
        inner: str) -> None:
    ours, theirs = _model(_ours, inner), _model(_keras_own, inner)
    # One finite step first, so every slot holds something to keep.
    for model in (ours, theirs):
        model.train_on_batch(*_data())
    weights = [keras.ops.convert_to_numpy(v) for v in ours.trainable_variables]
    slots = _slots(ours.optimizer)
    seeds_before = _seed_states(ours)
    scale = float(ours.optimizer.dynamic_scale)
    assert ours.optimizer.inner_optimizer.iterations.numpy() == 1

    for model in (ours, theirs):
        loss = model.train_on_batch(*_data(nan=True))
        assert np.isnan(loss)

    for before, after in zip(weights, ours.trainable_variables):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(after), before)
    for before, after in zip(slots, _slots(ours.optimizer)):
        np.testing.assert_array_equal(after, before)
    assert float(ours.optimizer.dynamic_scale) == scale / 2
    assert ours.optimizer.inner_optimizer.iterations.numpy() == 2
    # The forward pass ran: each Dropout's seed state advanced, exactly as
    # with Keras' own wrapper (which also skips the update, not the call).
    seeds_after = _seed_states(ours)
    assert len(seeds_after) == 2
    for before, after, own in zip(seeds_before, seeds_after,
                                  _seed_states(theirs)):
        assert not np.array_equal(after, before)
        np.testing.assert_array_equal(after, own)
