"""Models whose training meets the faults users meet, nothing planted.

Shared by the Keras 3 tests (`test_skip_record_natural.py`) and the
tf_keras case (`tf_keras_cases/cases_natural_faults.py`): every builder
takes either Keras module. Float16 layers get the `mixed_float16` policy
one by one (no global policy to leak into other tests); each model's
output layer is float32, as the mixed precision guide says.

- `deep_mlp`: 12 ReLU layers at `initial_scale=2**30`: the float32 output
  gradient overflows float16 where it enters `l11`, and everything below
  it turns NaN (Inf - Inf);
- `residual`: two branches added; `Rescaling(1000)` inside branch `a`
  makes its gradients overflow at a scale the other branch survives;
- `attention`: query and key projections whose logits overflow float16 in
  the forward pass (the loss is NaN);
- `log_loss` on `small_mlp(zero_output=True)`: the log of 0;
- `norm_loss` on `small_mlp(zero_output=True)`: a norm at 0, a real NaN
  of the backward pass (the loss is finite);
- a NaN in the input batch: `data(nan_row=...)`;
- `conv`: four ReLU Conv2D layers on 8x8 images (`images`) at a huge
  initial scale: the output gradient overflows float16 where it enters
  `c3`;
- `lstm`: two stacked LSTMs on 4-step sequences (`sequences`) at a huge
  initial scale: it overflows where it enters `lstm1`;
- `dropout_mlp`: `small_mlp` with a seeded Dropout between its layers,
  for the deep look's "changes nothing" (the seed generator's state too);
- a large input on one replica only: `data(big_rows=..., big=...)`.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

import numpy as np
import tensorflow as tf

HALF = "mixed_float16"
BATCH, FEATURES = 16, 8


def data(nan_row: Optional[int] = None, rows: int = 2 * BATCH,
         big_rows: Optional[slice] = None, big: float = 1.0
         ) -> Tuple[np.ndarray, np.ndarray]:
    """Inputs (rows, FEATURES) and targets (rows, 1); optionally one NaN,
    or `big_rows` multiplied by `big`."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, FEATURES)).astype("float32")
    if nan_row is not None:
        x[nan_row, 3] = np.nan
    if big_rows is not None:
        x[big_rows] *= big
    return x, np.ones((rows, 1), "float32")


def images(x: np.ndarray) -> np.ndarray:
    """(rows, 8, 8, 1) images of `data`'s (rows, 8) inputs: row i of each
    image is input i."""
    return np.tile(x.reshape(-1, FEATURES, 1, 1), (1, 1, FEATURES, 1))


def sequences(x: np.ndarray) -> np.ndarray:
    """(rows, 4, 2) sequences of `data`'s (rows, 8) inputs."""
    return x.reshape(-1, 4, FEATURES // 4)


def _glorot(keras: Any, seed: int) -> Any:
    """A seeded initializer: the same weights, so the same faults, always."""
    return keras.initializers.GlorotUniform(seed=seed)


def deep_mlp(keras: Any) -> Any:
    inputs = keras.Input((FEATURES,))
    h = inputs
    for i in range(12):
        h = keras.layers.Dense(32, activation="relu", name=f"l{i}",
                               dtype=HALF, kernel_initializer=_glorot(
                                   keras, i))(h)
    out = keras.layers.Dense(1, name="out", dtype="float32",
                             kernel_initializer=_glorot(keras, 12))(h)
    return keras.Model(inputs, out, name="net")


def residual(keras: Any) -> Any:
    inputs = keras.Input((FEATURES,))
    trunk = keras.layers.Dense(16, activation="relu", name="trunk",
                               dtype=HALF,
                               kernel_initializer=_glorot(keras, 1))(inputs)
    a = keras.layers.Dense(16, activation="relu", name="a1", dtype=HALF,
                           kernel_initializer=_glorot(keras, 2))(trunk)
    a = keras.layers.Rescaling(1000.0, name="amplify", dtype=HALF)(a)
    a = keras.layers.Dense(16, name="a2", dtype=HALF,
                           kernel_initializer=keras.initializers.RandomNormal(
                               stddev=1e-3, seed=1))(a)
    b = keras.layers.Dense(16, name="b1", dtype=HALF,
                           kernel_initializer=_glorot(keras, 3))(trunk)
    merged = keras.layers.Add(name="add", dtype=HALF)([trunk, a, b])
    out = keras.layers.Dense(1, name="out", dtype="float32",
                             kernel_initializer=_glorot(keras, 4))(merged)
    return keras.Model(inputs, out, name="net")


def attention(keras: Any) -> Any:
    """A transformer-ish block: (BATCH, 4 tokens, 2 features) inputs."""
    inputs = keras.Input((4, FEATURES // 4))
    big = keras.initializers.Constant(30.0)
    query = keras.layers.Dense(32, name="query", dtype=HALF,
                               kernel_initializer=big)(inputs)
    key = keras.layers.Dense(32, name="key", dtype=HALF,
                             kernel_initializer=big)(inputs)
    value = keras.layers.Dense(32, name="value", dtype=HALF,
                               kernel_initializer=_glorot(keras, 5))(inputs)
    mixed = keras.layers.Attention(name="attend", dtype=HALF)(
        [query, value, key])
    ffn = keras.layers.Dense(32, activation="relu", name="ffn", dtype=HALF,
                             kernel_initializer=_glorot(keras, 6))(mixed)
    pooled = keras.layers.Flatten(name="flat", dtype=HALF)(ffn)
    out = keras.layers.Dense(1, name="out", dtype="float32",
                             kernel_initializer=_glorot(keras, 7))(pooled)
    return keras.Model(inputs, out, name="net")


def conv(keras: Any) -> Any:
    """Four 3x3 ReLU Conv2D layers `c0`..`c3` (float16), a float32 Dense."""
    inputs = keras.Input((FEATURES, FEATURES, 1))
    h = inputs
    for i in range(4):
        h = keras.layers.Conv2D(8, 3, padding="same", activation="relu",
                                name=f"c{i}", dtype=HALF,
                                kernel_initializer=_glorot(keras, 20 + i))(h)
    h = keras.layers.Flatten(name="flat", dtype=HALF)(h)
    out = keras.layers.Dense(1, name="out", dtype="float32",
                             kernel_initializer=_glorot(keras, 30))(h)
    return keras.Model(inputs, out, name="net")


def lstm(keras: Any) -> Any:
    """LSTMs `lstm0` (whole sequence) and `lstm1` (last state), float16,
    and a float32 Dense."""
    inputs = keras.Input((4, FEATURES // 4))
    h = inputs
    for i, whole in enumerate((True, False)):
        h = keras.layers.LSTM(
            16, return_sequences=whole, name=f"lstm{i}", dtype=HALF,
            kernel_initializer=_glorot(keras, 40 + i),
            recurrent_initializer=keras.initializers.Orthogonal(
                seed=45 + i))(h)
    out = keras.layers.Dense(1, name="out", dtype="float32",
                             kernel_initializer=_glorot(keras, 44))(h)
    return keras.Model(inputs, out, name="net")


def dropout_mlp(keras: Any, **dropout: Any) -> Any:
    """`small_mlp` with `Dropout(0.5, seed=3, **dropout)` after its first
    layer (tf_keras: `force_generator=True` gives it a state variable, a
    `tf.random.Generator`'s)."""
    inputs = keras.Input((FEATURES,))
    h = keras.layers.Dense(16, activation="relu", name="l0", dtype=HALF,
                           kernel_initializer=_glorot(keras, 8))(inputs)
    h = keras.layers.Dropout(0.5, seed=3, name="drop", dtype=HALF,
                             **dropout)(h)
    h = keras.layers.Dense(16, activation="relu", name="l1", dtype=HALF,
                           kernel_initializer=_glorot(keras, 9))(h)
    out = keras.layers.Dense(1, name="out", dtype="float32",
                             kernel_initializer=_glorot(keras, 10))(h)
    return keras.Model(inputs, out, name="net")


def small_mlp(keras: Any, zero_output: bool = False) -> Any:
    """Two float16 layers and a float32 output (all zeros at first with
    `zero_output`, for the log of zero)."""
    inputs = keras.Input((FEATURES,))
    h = keras.layers.Dense(16, activation="relu", name="l0", dtype=HALF,
                           kernel_initializer=_glorot(keras, 8))(inputs)
    h = keras.layers.Dense(16, activation="relu", name="l1", dtype=HALF,
                           kernel_initializer=_glorot(keras, 9))(h)
    out = keras.layers.Dense(
        1, name="out", dtype="float32",
        kernel_initializer="zeros" if zero_output else _glorot(keras, 10))(h)
    return keras.Model(inputs, out, name="net")


def log_loss(y_true: Any, y_pred: Any) -> Any:
    """-log(y_pred): Inf where the prediction is 0."""
    return -tf.reduce_mean(tf.math.log(y_pred)) + 0.0 * tf.reduce_mean(
        y_true)


def norm_loss(y_true: Any, y_pred: Any) -> Any:
    """The norm of the predictions: 0 for `small_mlp(zero_output=True)`,
    where its gradient is a real NaN (the sqrt's gradient at 0 is +Inf,
    times the square's, 0), at any loss scale."""
    return tf.norm(y_pred) + 0.0 * tf.reduce_mean(y_true)


def fit(keras: Any, monitor_type: Any, optimizer_type: Any,
        model: Any, x: np.ndarray, y: np.ndarray, *, initial_scale: float,
        jit_compile: bool, loss: Any = "mse", epochs: int = 1,
        deep_look: bool = False) -> Tuple[Any, Any]:
    """Trains `model` with SGD under a LossScaleOptimizer and a monitor;
    returns (optimizer, monitor)."""
    opt = optimizer_type(keras.optimizers.SGD(1e-3),
                         initial_scale=initial_scale)
    model.compile(optimizer=opt, loss=loss, jit_compile=jit_compile)
    monitor = monitor_type(report=False, deep_look=deep_look)
    model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False,
              verbose=0, callbacks=[monitor])
    return opt, monitor


def last_part(name: Optional[str]) -> Optional[str]:
    """`l11` of `net/l11` or `l11` (Keras 3 prefixes a Sequential's name)."""
    return None if name is None else name.rsplit("/", 1)[-1]


Builder = Callable[[Any], Any]
