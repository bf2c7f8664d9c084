"""`import tf_lossscale` works whatever the program imported first.

Some programs bind the name `keras` to tf_keras before anything else
(`sys.modules["keras"] = tf_keras`, as TensorFlowASR needs on TF 2.16+).
Importing tf_lossscale after that must work, and train exactly as when it
is imported first.
"""

import json
import os
import subprocess
import sys

import pytest

PROGRAM = """
import json, os, sys
os.environ["TF_USE_LEGACY_KERAS"] = "1"
if {first}:
    import tf_lossscale
import tf_keras
sys.modules["keras"] = tf_keras
import keras
import numpy as np
import tensorflow as tf
import tf_lossscale

tf_keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2),
                          keras.layers.Dense(1)])
opt = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(0.1),
                                      initial_scale=2.0 ** 8)
model.compile(optimizer=opt, loss="mse")
x = np.arange(12, dtype="float32").reshape(4, 3) / 10
y = x.sum(axis=1, keepdims=True)
bad = x.copy()
bad[0, 0] = np.nan
for batch in (x, bad, x):
    model.train_on_batch(batch, y)
print(json.dumps({{
    "flavour": type(opt).__module__,
    "weights": [w.tolist() for w in model.get_weights()],
    "scale": float(opt.loss_scale),
    "skipped": opt.last_skip is not None,
    "iterations": int(opt.iterations)}}))
"""


def _run(first: bool) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, "-c", PROGRAM.format(first=first)],
                          capture_output=True, text=True, timeout=300,
                          env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_importing_after_keras_is_aliased_to_tf_keras_trains_as_before():
    after, before = _run(first=False), _run(first=True)
    assert after["flavour"] == "tf_lossscale.tf_keras_optimizer"
    assert after["skipped"] and after["scale"] == 128.0
    # tf_keras counts a skipped step in `iterations`, as its own wrapper.
    assert after["iterations"] == 3
    assert after == before


SUBCLASS_PROGRAM = """
import json, sys, types
import tf_lossscale
import tf_keras
# A module of the user's (as Model Garden's official.modeling.optimization
# is): its optimizer class comes from no Keras package itself.
user = types.ModuleType("user_optimizers")
sys.modules["user_optimizers"] = user
exec("import tf_keras\\n"
     "class Averaged(tf_keras.optimizers.{family}SGD):\\n"
     "    pass\\n", user.__dict__)
loaded = "tf_lossscale.tf_keras_optimizer" in sys.modules
opt = tf_lossscale.LossScaleOptimizer(user.Averaged(0.5), initial_scale=4.0)
print(json.dumps({{"loaded_before": loaded,
                   "flavour": type(opt).__name__,
                   "scale": float(opt.loss_scale)}}))
"""


@pytest.mark.parametrize("family, flavour", [
    ("legacy.", "TfKerasLegacyLossScaleOptimizer"),
    ("", "TfKerasLossScaleOptimizer")], ids=["legacy", "current"])
def test_a_subclass_in_a_user_module_finds_the_tf_keras_flavour(family,
                                                                 flavour):
    """The flavours of tf_keras load when first needed: also for an
    optimizer class whose own module is the user's, through its bases."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(
        [sys.executable, "-c", SUBCLASS_PROGRAM.format(family=family)],
        capture_output=True, text=True, timeout=300, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"loaded_before": False, "flavour": flavour,
                      "scale": 4.0}
