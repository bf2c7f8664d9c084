"""tf_keras' own LossScaleOptimizer tests, run on tf_keras and on ours.

Fetch the test file (it is not in the tf_keras wheel) verbatim from the
public repository keras-team/tf-keras, `tf_keras/mixed_precision/
loss_scale_optimizer_test.py` (measured at commit aeff7f13, 58,794
characters), to `originals/files/tf_keras/loss_scale_optimizer_test.py`
(git-ignored: never commit it). The helpers it imports (`test_util`,
`testing_infra`, ...) ship in the wheel under `tf_keras.src`. Then run:

    source /opt/dev/bin/activate
    python originals/tf_keras_suite.py [--file PATH] [-k EXPR] [--v2-as-public]

It runs the file twice with pytest under `TF_USE_LEGACY_KERAS=1` (this
module is the pytest plugin of both runs): once as is, once with the classes
the tests reach as `loss_scale_optimizer.X` swapped for ours (tf_keras'
internals keep their own: only the test module's name is rebound):

- `BaseLossScaleOptimizer` (tf_keras' public
  `tf_keras.mixed_precision.LossScaleOptimizer`, which picks the family's
  class) -> `tf_lossscale.LossScaleOptimizer`;
- `LossScaleOptimizerV3` (the class of tf_keras' current optimizers) ->
  `tf_lossscale.tf_keras_optimizer.TfKerasLossScaleOptimizer`;
- `LossScaleOptimizer` (the class of the legacy family, OptimizerV2) ->
  `tf_lossscale.tf_keras_legacy_optimizer.TfKerasLegacyLossScaleOptimizer`,
  or with `--v2-as-public` -> `tf_lossscale.LossScaleOptimizer`.

The test file reaches no other class (its `LossScaleOptimizerV1` is only a
`class_name` in a config, which tf_keras' `optimizers.deserialize` reads).
It prints the pass counts of both runs and every test failing on ours with
its classification from `VERDICTS` (`deliberate`, `private`, `message`,
`defect`; a failure not in the table is `UNCLASSIFIED`), and exits 1 if any
is a `defect` or `UNCLASSIFIED` (the report is `_report.print_report`).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import pathlib
import sys
import types
from typing import Any, Dict, List, Optional, Sequence

import _report

HERE = pathlib.Path(__file__).resolve().parent
DEFAULT_FILE = HERE / "files" / "tf_keras" / "loss_scale_optimizer_test.py"
SWAP_ENV = "TF_KERAS_SUITE_SWAP"  # "original", "ours" or "ours-v2-public".

# Test name -> (classification, why). A key also covers the names that
# begin with it and "_", since tf_keras' parameterized names carry their
# combination (see `_report.lookup`).
_READ_THROUGH = ("deliberate", "hyperparameters of the inner optimizer read "
                 "and write through the wrapper (API.md section 0): "
                 "`lso.nesterov` is the inner optimizer's, and in dir(lso)")
_V2_IS_A_FAMILY = ("private", "--v2-as-public only: the test takes tf_keras' "
                   "private LossScaleOptimizer as the legacy family's class "
                   "(type equality, or isinstance to tell the families "
                   "apart); ours is both families'")
VERDICTS: Dict[str, _report.Verdict] = {
    "testArbitraryAttributesNotExposed": _READ_THROUGH,
    "testDir": _READ_THROUGH,
    "testErrorWhenV3LsoWrapsV2Optimizer": (
        "message", "fails on tf_keras too: its regex predates the rename to "
        "tf_keras/ (tf_keras 2.21 says 'defined in tf_keras/optimizer_"
        "expeirmental/...'); ours names what was passed, what is accepted "
        "and the class to use"),
    "test_from_config_with_invalid_multiplier": (
        "message", "same ValueError; the wording is "
        "tf_lossscale/config_conversion.py's (not this lane)"),
    "testErrorWhenV2LsoWrapsV3Optimizer": _V2_IS_A_FAMILY,
    "testConvertToLegacyOptimizer": _V2_IS_A_FAMILY,
    "testSerializationWithBuiltInOptimizer": _V2_IS_A_FAMILY,
    "testDynamicLossScaleWithSlots": _V2_IS_A_FAMILY,
}


# The pytest plugin (loaded with `-p tf_keras_suite` in both runs).

class _SrcAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves `tf_keras.X` to the wheel's `tf_keras.src.X`, as the
    repository's layout has it, when `tf_keras.X` does not exist."""

    def find_spec(self, fullname: str, path: Any, target: Any = None
                  ) -> Optional[importlib.machinery.ModuleSpec]:
        if not fullname.startswith("tf_keras.") or fullname.startswith(
                "tf_keras.src."):
            return None
        source = "tf_keras.src." + fullname[len("tf_keras."):]
        if importlib.util.find_spec(source) is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, self,
                                              loader_state=source)

    def create_module(self, spec: importlib.machinery.ModuleSpec
                      ) -> types.ModuleType:
        return importlib.import_module(spec.loader_state)

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def _swapped(real: types.ModuleType, v2_as_public: bool) -> types.ModuleType:
    import tf_lossscale
    from tf_lossscale import tf_keras_legacy_optimizer, tf_keras_optimizer
    proxy = types.ModuleType(real.__name__)
    proxy.__dict__.update(real.__dict__)
    proxy.__dict__.update(
        BaseLossScaleOptimizer=tf_lossscale.LossScaleOptimizer,
        LossScaleOptimizerV3=tf_keras_optimizer.TfKerasLossScaleOptimizer,
        LossScaleOptimizer=(
            tf_lossscale.LossScaleOptimizer if v2_as_public else
            tf_keras_legacy_optimizer.TfKerasLegacyLossScaleOptimizer))
    return proxy


def pytest_configure(config: Any) -> None:
    sys.meta_path.append(_SrcAlias())


def pytest_collection_modifyitems(session: Any, config: Any,
                                  items: List[Any]) -> None:
    swap = os.environ.get(SWAP_ENV, "original")
    for module in _report.collected_modules(items):
        # The repository's `tf_keras.optimizers` is the wheel's
        # `tf_keras.src.optimizers` (the public one lacks
        # `convert_to_legacy_optimizer`).
        vars(module)["optimizers"] = importlib.import_module(
            "tf_keras.src.optimizers")
        real = getattr(module, "loss_scale_optimizer", None)
        if not isinstance(real, types.ModuleType) or not hasattr(
                real, "LossScaleOptimizerV3"):
            raise RuntimeError(f"{module.__file__} no longer reaches tf_keras'"
                               " classes as loss_scale_optimizer.X")
        if swap != "original":
            vars(module)["loss_scale_optimizer"] = _swapped(
                real, v2_as_public=swap == "ours-v2-public")


# The runner.

def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _report.parse_args(__doc__, argv, {
        "--v2-as-public": "swap tf_keras' LossScaleOptimizer (legacy family) "
                          "for tf_lossscale.LossScaleOptimizer"}, DEFAULT_FILE)
    original, ours = (
        _report.run_plugin_suite("tf_keras_suite", args.file, SWAP_ENV,
                                 swap, args.k, TF_USE_LEGACY_KERAS="1")
        for swap in ("original", "ours-v2-public" if args.v2_as_public
                     else "ours"))
    return _report.print_report(
        original, ours,
        lambda outcome: _report.lookup(outcome.name, VERDICTS),
        original_label="tf_keras' class", original_short="tf_keras",
        skipped_note="pytest skips the GPU-only and the tests tf_keras "
        "skips itself", verbose=args.verbose)


if __name__ == "__main__":
    sys.exit(main())
