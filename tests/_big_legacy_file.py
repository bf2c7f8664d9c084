"""A large legacy module for measuring `migrate` (issue 33, item 4).

`python tests/_big_legacy_file.py LINES PATH` writes a module of about
LINES lines: functions that each build a legacy loss-scale optimizer, scale
a loss, compile a model and read a loss scale, so that every rule runs on
every function, and the optimizer calls number in the thousands.
"""

import sys

_HEADER = """\
import tensorflow as tf
from tensorflow.keras.mixed_precision import experimental as mp

mp.set_policy('mixed_float16')

"""

_FUNCTION = """\
def step_{i}(model, data):
    inner_{i} = tf.keras.optimizers.SGD(0.1)
    opt_{i} = mp.LossScaleOptimizer(inner_{i}, loss_scale=128)
    ls_{i} = tf.train.experimental.DynamicLossScale(1024)
    var_{i} = tf.Variable(1.0)
    with tf.GradientTape() as tape:
        loss = opt_{i}.get_scaled_loss(var_{i} * 2.0)
    grads = opt_{i}.get_unscaled_gradients(tape.gradient(loss, [var_{i}]))
    opt_{i}.apply_gradients(zip(grads, [var_{i}]))
    model.compile(optimizer=tf.keras.optimizers.Adam(), loss='mse')
    other_{i} = tf.keras.optimizers.Adam()
    other_{i}.apply_gradients(zip(grads, [var_{i}]))
    current = opt_{i}.loss_scale()
    return current, ls_{i}, data


"""


def source(lines: int) -> str:
    """A legacy module of about `lines` lines."""
    per = _FUNCTION.count("\n")
    count = max(1, (lines - _HEADER.count("\n")) // per)
    return _HEADER + "".join(_FUNCTION.format(i=i) for i in range(count))


if __name__ == "__main__":
    with open(sys.argv[2], "w") as f:
        f.write(source(int(sys.argv[1])))
