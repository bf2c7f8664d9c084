"""`OptimizerConfig`: `from_config` of every LossScaleOptimizer.

A base of `optimizer.LossScaleOptimizer` (so it comes before the Keras
classes in a flavour's method order). It reads what the optimizer class
provides: the flavour lookup (`_flavour_for`, `_PICKS_FLAVOUR`), the
flavour's `_reads` and `_deserialize_inner`.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, cast

from tf_lossscale import config_conversion, flavour_registry

__all__ = ["OptimizerConfig"]


class OptimizerConfig:
    """The config methods shared by every flavour."""

    @classmethod
    def _flavour_for(cls, inner_optimizer: Any) -> Any:
        """The flavour that wraps `inner_optimizer` (the optimizer's)."""
        raise NotImplementedError

    @classmethod
    def from_config(cls, config: Dict[str, Any],
                    custom_objects: Optional[Dict[str, Any]] = None
                    ) -> Any:
        """Creates the optimizer from `get_config()`'s output.

        Also takes Keras 3's own LossScaleOptimizer configs and the TF <= 2.3
        experimental ones (`optimizer` and `loss_scale` entries), converted
        by `config_conversion.upgrade_optimizer_config`.

        Raises:
          ValueError: `config` is not a dict, has no inner optimizer, or
            holds loss-scaling values that do not convert.
          TypeError: the inner optimizer's config names no known optimizer,
            or `config` holds an unknown key.
        """
        if not isinstance(config, Mapping):
            raise ValueError(
                "from_config() takes a dict (what get_config() returns); "
                f"got {config!r} of type {type(config).__name__}.")
        config = config_conversion.upgrade_optimizer_config(config)
        if "inner_optimizer" not in config:
            raise ValueError(
                "A LossScaleOptimizer config needs an 'inner_optimizer' entry "
                "(or TF <= 2.3's 'optimizer') holding the wrapped optimizer; "
                f"got {config!r}.")
        inner_config = config.pop("inner_optimizer")
        inner = cls._flavour_for_config(inner_config)._deserialize_inner(
            inner_config, custom_objects)
        return cls._from_current_args(inner, config)

    @classmethod
    def _flavour_for_config(cls, inner_config: Any
                            ) -> Any:
        """The flavour that deserializes `inner_config` (see `_reads`)."""
        if not cls.__dict__.get("_PICKS_FLAVOUR", False):
            return cls
        if not isinstance(inner_config, dict):
            return cls._flavour_for(inner_config)
        for attempt in range(2):
            for _, flavour in flavour_registry.flavours_of(cls):
                if cast(Any, flavour)._reads(inner_config):
                    return flavour
            if attempt or not flavour_registry.load_flavours(None):
                break
        raise TypeError(
            "inner_optimizer must be the config of a Keras 3 or tf_keras "
            f"optimizer; got {inner_config!r}.")

    @classmethod
    def _reads(cls, inner_config: Dict[str, Any]) -> bool:
        """Whether this flavour deserializes `inner_config` (a flavour says)."""
        return False

    @classmethod
    def _from_current_args(cls, inner_optimizer: Any,
                           args: Dict[str, Any]) -> Any:
        return cast(Any, cls)(inner_optimizer, **args)

    @classmethod
    def _deserialize_inner(cls, config: Any,
                           custom_objects: Optional[Dict[str, Any]]) -> Any:
        raise NotImplementedError

