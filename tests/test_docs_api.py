"""docs/api.md documents every public name and what users call on them.

The page is mkdocstrings directives (`::: module.path` with a `heading`);
this module reads them and checks that each public name of
`tf_lossscale.__all__` has a heading that is its import name, that each
directive's object is the very object users import, and that every public
method and property the Keras 3 `LossScaleOptimizer` defines in tf_lossscale
(its own, its mixins' and the flavour's) is documented, except the Keras 3
hyperparameters it reads through to the inner optimizer and Keras' own
machinery.
"""

import importlib
import re
from pathlib import Path
from typing import Any, Dict, List, Tuple

import keras

import tf_lossscale
from tf_lossscale import compat
from tf_lossscale.compat import migrate

PAGE = Path(__file__).resolve().parent.parent / "docs" / "api.md"
DIRECTIVE = re.compile(
    r"^::: (?P<path>[\w.]+)\n(?P<options>(?:    .*\n)*)", re.M)

# Read through to the inner optimizer (one sentence on `inner_optimizer`),
# or Keras 3's machinery that `fit` calls and users do not.
NOT_LISTED = {
    "amsgrad", "beta", "beta_1", "beta_2", "centered", "clipnorm",
    "clipvalue", "ema_momentum", "ema_overwrite_frequency", "epsilon",
    "global_clipnorm", "initial_accumulator_value",
    "l1_regularization_strength", "l2_regularization_strength",
    "l2_shrinkage_regularization_strength", "learning_rate_power",
    "momentum", "nesterov", "rho", "use_ema", "weight_decay", "build",
    "stateless_apply",
}


def directives() -> List[Tuple[str, str, List[str]]]:
    """(object path, heading, members listed) of each directive."""
    found = []
    for match in DIRECTIVE.finditer(PAGE.read_text(encoding="utf-8")):
        options = match.group("options")
        heading = re.search(r'heading: "([^"]+)"', options)
        assert heading, match.group(0)
        members = re.findall(r"^        - (\w+)$", options, re.M)
        found.append((match.group("path"), heading.group(1), members))
    return found


def resolve(path: str) -> Any:
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(path)


def test_every_public_name_has_its_heading():
    headings: Dict[str, str] = {h: p for p, h, _ in directives()}
    for name in tf_lossscale.__all__:
        heading = ("tf_lossscale.experimental.LossScaleOptimizer"
                   if name == "experimental" else f"tf_lossscale.{name}")
        assert heading in headings, f"no heading {heading}"
    for name in compat.__all__:
        assert f"tf_lossscale.compat.{name}" in headings, name
    assert "tf_lossscale.compat.migrate.rewrite" in headings


def test_each_heading_is_the_object_users_import():
    opt = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    for path, heading, _ in directives():
        documented = resolve(path)
        if heading.startswith("LossScaleOptimizer."):
            method = heading.split(".", 1)[1]
            assert getattr(type(opt), method) is documented, heading
        elif heading == "tf_lossscale.compat.migrate.rewrite":
            assert migrate.rewrite is documented
        else:
            assert resolve(heading) is documented, heading


def test_what_users_call_on_the_optimizer_is_documented():
    opt = tf_lossscale.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    documented = set()
    for _path, heading, members in directives():
        if heading == "tf_lossscale.LossScaleOptimizer":
            documented |= set(members)
        elif heading.startswith("LossScaleOptimizer."):
            documented.add(heading.split(".", 1)[1])
    public = {name for klass in type(opt).__mro__
              if klass.__module__.startswith("tf_lossscale")
              for name in vars(klass) if not name.startswith("_")}
    public |= {"inner_optimizer"}
    assert public - NOT_LISTED - documented == set()
    for name in ("last_skip", "raise_if_stuck", "scale_loss",
                 "apply_gradients", "minimize", "get_scaled_loss",
                 "get_unscaled_gradients", "skipped_steps"):
        assert name in documented, name
    for name in documented:
        assert hasattr(opt, name), name
