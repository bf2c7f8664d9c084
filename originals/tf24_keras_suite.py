"""TF 2.4's Keras LossScaleOptimizer tests, run on TF's Keras and on ours.

Fetch the test file (it is not in the TensorFlow wheel) verbatim from the
public repository tensorflow/tensorflow,
`tensorflow/python/keras/mixed_precision/loss_scale_optimizer_test.py` at
commit c3bd2f4bcdcf440cb6bbc3d88cef3f3bc56dbb70 (TF 2.4's lineage: it tests
`LossScaleOptimizer` and the experimental `LossScaleOptimizerV1`; 1,095
lines, 47,562 characters with LF line ends), to
`originals/files/tf24_keras/loss_scale_optimizer_test.py` (git-ignored:
never commit it). The helper it imports,
`tensorflow.python.keras.mixed_precision.test_util`, ships in the TF 2.21
wheel, as does the rest of TF 2.4's Keras (`tensorflow.python.keras`).
Then run:

    source /opt/dev/bin/activate
    python originals/tf24_keras_suite.py [--file PATH] [-k EXPR] [--verbose]
        [--legacy-inner [--family-classes]]

It runs the file twice with pytest (this module is the pytest plugin of
both runs): once as is, on TF 2.4's classes; once with the names the test
module reaches swapped for ours (TF's own modules keep their classes: only
the test module's globals are rebound, after collection, before any test
runs):

- `loss_scale_optimizer.LossScaleOptimizer` ->
  `tf_lossscale.LossScaleOptimizer`;
- `loss_scale_optimizer.LossScaleOptimizerV1` ->
  `tf_lossscale.experimental.LossScaleOptimizer`;
- `tf_loss_scale_module` (TF's `training/experimental/loss_scale.py`) -> a
  namespace of `tf_lossscale.FixedLossScale`, `DynamicLossScale`, `get`,
  `serialize`, `deserialize`, and `LossScale` (the test subclasses it to
  pass a loss scale of another class).

The tests build TF 2.4's own optimizers (`tensorflow.python.keras.
optimizer_v2.*`, the ancestor of tf_keras' legacy family, but not its
subclass). Ours refuses them, a decision (TF's frozen private Keras 2.4
copy is unsupported): the constructor raises `TypeError: inner_optimizer
must be a Keras 3 optimizer ...`, which names the tf_keras.optimizers.legacy
class to use instead. Those failures are `unsupported`, listed as one line
with their count. With `--legacy-inner` the ours run also
rebinds the test module's optimizer modules to tf_keras' legacy family
(`gradient_descent.SGD` -> `tf_keras.optimizers.legacy.SGD`, `adam.Adam` ->
`tf_keras.optimizers.legacy.Adam`, `optimizer_v2.OptimizerV2` ->
`tf_keras.optimizers.legacy.Optimizer`, `optimizers` ->
`tf_keras.optimizers`) and sets `TF_USE_LEGACY_KERAS=1`: the tests then
check our tf_keras legacy flavour, which is what TF 2.4 code gets once
ported to today's spelling. `--family-classes` (with `--legacy-inner`) also
maps the test's `LossScaleOptimizer` and `LossScaleOptimizerV1` to our two
classes for that family (`tf_keras_legacy_optimizer.TfKerasLegacyLossScale
Optimizer` and its experimental twin), as tf_keras' own test file names
tf_keras' class of that family `LossScaleOptimizer`: the tests that compare
`type(opt)` with it then check the class of the family, as tf_keras' do.

TF 2.21 moved a few modules the file imports; both runs get the same
aliases (`tensorflow.python.distribute.distribution_strategy_context` ->
`distribute_lib`, `tensorflow.python.training.tracking.util` ->
`tensorflow.python.checkpoint.checkpoint`, and `ops.Tensor`,
`ops.IndexedSlices`, `ops.convert_to_tensor_v2_with_dispatch`).

It prints the pass counts of both runs and every test failing on ours with
its classification from `VERDICTS` (`deliberate`, `private`, `message`,
`unsupported`, `defect`; a failure not in the table is `UNCLASSIFIED`), and
exits 1 if any is a `defect` or `UNCLASSIFIED` (the report is
`_report.print_report`).
"""

from __future__ import annotations

import os
import pathlib
import sys
import types
from typing import Any, Dict, List, Optional, Sequence

import _report

HERE = pathlib.Path(__file__).resolve().parent
DEFAULT_FILE = HERE / "files" / "tf24_keras" / "loss_scale_optimizer_test.py"
# "original", "ours", "ours-legacy" or "ours-legacy-family".
SWAP_ENV = "TF24_KERAS_SUITE_SWAP"

# Ours refuses an optimizer of TF's frozen private Keras 2.4 copy
# (`tensorflow.python.keras`): a decision, so in the plain run every test
# that wraps one is `unsupported`. The TypeError names the tf_keras.
# optimizers.legacy class to use when the optimizer's own class is TF's;
# the file's own subclasses (`MySGD`, `MyOptimizer`, all of TF 2.4's
# `gradient_descent.SGD` or `optimizer_v2.OptimizerV2`) get it without that
# hint, and are told by their module, the test file's.
_REFUSED = "inner_optimizer must be a Keras 3 optimizer"
_FROZEN_KERAS = "frozen private copy of Keras 2.4 (tensorflow.python.keras)"
_TEST_FILE_CLASS = "of type loss_scale_optimizer_test."
_FROZEN_KERAS_VERDICT: _report.Verdict = (
    "unsupported", "TF's frozen private Keras 2.4 copy; the --legacy-inner "
    "run measures the behaviour")

# Test name -> (classification, why), for the failures whose message does
# not show their cause. A key covers the names that are it or begin with it
# and "_" (the parameters follow: `testDir_test_mode_eager`, not
# `testDirV1_test_mode_eager`).
VERDICTS: Dict[str, _report.Verdict] = {
    # Without --legacy-inner (TF 2.4's optimizers, which ours refuses).
    **{f"testGetConfig{kind}_test_fromconfig_{cls}_getconfig_tf23": (
        "unsupported", "a TF 2.3 config names no module, so ours builds the "
        "SGD of the process's Keras (Keras 3 here; TF 2.4 built its frozen "
        "copy's), which has no `lr`, the alias the test reads; passes with "
        "--legacy-inner")
       for kind in ("Fixed", "Dynamic") for cls in ("v1", "v2")},
    # With --legacy-inner (tf_keras' legacy optimizers, our legacy flavour).
    "testArbitraryAttributesNotExposed": (
        "deliberate", "hyperparameters of the inner optimizer read and "
        "write through the wrapper: `nesterov` reads and writes the inner "
        "SGD's (TF 2.4: AttributeError, and a write stayed on the wrapper)"),
    "testDir": (
        "deliberate", "hyperparameters of the inner optimizer read and "
        "write through the wrapper, so dir() lists `nesterov`"),
    **dict.fromkeys(
        ("testSerializationWithBuiltInOptimizerV1",
         "testSerializationWithBuiltInOptimizerV2"),
        ("deliberate", "type(opt) is the class of the inner optimizer's "
         "family (TfKerasLegacyLossScaleOptimizer, a subclass of "
         "tf_lossscale.LossScaleOptimizer), as tf_keras' public class gives "
         "its family class (API.md section 0); every value, the config and "
         "the non-experimental class are as TF 2.4's")),
}


# The pytest plugin (loaded with `-p tf24_keras_suite` in both runs).

def _alias_moved_modules() -> None:
    """Makes the TF 2.4 import paths of the test file resolve on TF 2.21."""
    from tensorflow.python.checkpoint import checkpoint
    from tensorflow.python.distribute import distribute_lib
    from tensorflow.python.framework import (
        indexed_slices,
        ops,
        tensor,
        tensor_conversion,
    )
    sys.modules.setdefault(
        "tensorflow.python.distribute.distribution_strategy_context",
        distribute_lib)
    tracking = types.ModuleType("tensorflow.python.training.tracking")
    tracking.util = checkpoint  # type: ignore[attr-defined]
    sys.modules.setdefault("tensorflow.python.training.tracking", tracking)
    sys.modules.setdefault("tensorflow.python.training.tracking.util",
                           checkpoint)
    for name, value in (("Tensor", tensor.Tensor),
                        ("IndexedSlices", indexed_slices.IndexedSlices),
                        ("convert_to_tensor_v2_with_dispatch",
                         tensor_conversion.convert_to_tensor_v2_with_dispatch)):
        if not hasattr(ops, name):
            setattr(ops, name, value)


def _namespace(name: str, **values: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(values)
    return module


def _swap(module: types.ModuleType, legacy_inner: bool,
          family_classes: bool) -> None:
    """Rebinds the test module's names of the classes under test to ours."""
    import tf_lossscale
    real = vars(module)["loss_scale_optimizer"]
    names: Dict[str, Any] = {
        "loss_scale_optimizer": _namespace(real.__name__, **dict(
            vars(real), LossScaleOptimizer=tf_lossscale.LossScaleOptimizer,
            LossScaleOptimizerV1=tf_lossscale.experimental.LossScaleOptimizer)),
        "tf_loss_scale_module": _namespace(
            "tf_lossscale", LossScale=tf_lossscale.LossScale,
            FixedLossScale=tf_lossscale.FixedLossScale,
            DynamicLossScale=tf_lossscale.DynamicLossScale,
            get=tf_lossscale.get, serialize=tf_lossscale.serialize,
            deserialize=tf_lossscale.deserialize),
    }
    if family_classes:
        # The classes of tf_keras' legacy family, as tf_keras names them
        # (its `LossScaleOptimizer` is that family's class).
        from tf_lossscale import tf_keras_legacy_optimizer as family
        names["loss_scale_optimizer"] = _namespace(real.__name__, **dict(
            vars(real),
            LossScaleOptimizer=family.TfKerasLegacyLossScaleOptimizer,
            LossScaleOptimizerV1=(
                family.TfKerasLegacyExperimentalLossScaleOptimizer)))
    if legacy_inner:
        import tf_keras
        legacy = tf_keras.optimizers.legacy
        names.update(
            gradient_descent=_namespace("sgd", SGD=legacy.SGD),
            adam=_namespace("adam", Adam=legacy.Adam),
            optimizer_v2=_namespace("optimizer_v2",
                                    OptimizerV2=legacy.Optimizer),
            optimizers=tf_keras.optimizers)
    vars(module).update(names)


def pytest_configure(config: Any) -> None:
    _alias_moved_modules()


def pytest_collection_modifyitems(session: Any, config: Any,
                                  items: List[Any]) -> None:
    swap = os.environ.get(SWAP_ENV, "original")
    for module in _report.collected_modules(items):
        real = getattr(module, "loss_scale_optimizer", None)
        if not hasattr(real, "LossScaleOptimizerV1") or not hasattr(
                module, "tf_loss_scale_module"):
            raise RuntimeError(f"{module.__file__} no longer reaches TF's "
                               "classes as loss_scale_optimizer.X")
        if swap != "original":
            _swap(module, legacy_inner=swap.startswith("ours-legacy"),
                  family_classes=swap == "ours-legacy-family")


# The runner.

def verdict(outcome: _report.Outcome, legacy_inner: bool
            ) -> _report.Verdict:
    """`unsupported` if the plain run's ours refused TF 2.4's own optimizer
    (with --legacy-inner every optimizer is tf_keras': a refusal is not
    that decision), else the verdict of `VERDICTS`."""
    refused = _REFUSED in outcome.message and (
        _FROZEN_KERAS in outcome.message
        or _TEST_FILE_CLASS in outcome.message)
    if refused and not legacy_inner:
        return _FROZEN_KERAS_VERDICT
    return _report.lookup(outcome.name, VERDICTS)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _report.parse_args(__doc__, argv, {
        "--legacy-inner": "on ours, build tf_keras' legacy optimizers where "
                          "the tests build TF 2.4's",
        "--family-classes": "with --legacy-inner: the test's "
                            "LossScaleOptimizer(V1) is our class for tf_keras' "
                            "legacy family (as tf_keras names that family's "
                            "class), not the public class"}, DEFAULT_FILE)
    if args.family_classes and not args.legacy_inner:
        raise SystemExit("--family-classes goes with --legacy-inner")
    legacy = {"TF_USE_LEGACY_KERAS": "1"} if args.legacy_inner else {}
    original = _report.run_plugin_suite(
        "tf24_keras_suite", args.file, SWAP_ENV, "original", args.k)
    ours = _report.run_plugin_suite(
        "tf24_keras_suite", args.file, SWAP_ENV,
        "ours-legacy-family" if args.family_classes
        else "ours-legacy" if args.legacy_inner else "ours", args.k, **legacy)
    return _report.print_report(
        original, ours,
        lambda outcome: verdict(outcome, legacy_inner=args.legacy_inner),
        original_label="TF 2.4's Keras classes", original_short="TF's",
        skipped_note="pytest skips the GPU-only tests", verbose=args.verbose)


if __name__ == "__main__":
    sys.exit(main())
