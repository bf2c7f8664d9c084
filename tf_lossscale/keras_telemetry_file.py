"""`save_telemetry=True` in Keras 3's `.keras` files.

Keras 3 saves an optimizer in a `.keras` file by position: its `variables`
as `optimizer/vars/0..n`, and then every Keras-saveable object it reaches
through an attribute, each under that attribute's name. The telemetry
(`skipped_steps` and the run of skipped steps) is kept out of `variables`,
so that the positions stay exactly those of Keras' own LossScaleOptimizer;
with the option on, the flavour has one more such attribute,
`_loss_scale_telemetry`: a `TelemetryEntry` (made once, by
`telemetry.Telemetry.file_entry`), whose variables Keras then saves by name
under `optimizer/_loss_scale_telemetry/vars` and loads back. With the option
off (the default) the attribute is None, which Keras skips: the file is the
one Keras' own optimizer writes, and it loads into that optimizer and back.
A file written with the option loads into Keras' own optimizer too (Keras
reads no group it has no attribute for).
"""

from __future__ import annotations

from typing import Any, Dict

import tensorflow as tf

from tf_lossscale import _tf_private

__all__ = ["TelemetryEntry"]


class _Variables:
    """A plain holder, so that Keras walks no container of variables."""

    __slots__ = ("by_key",)

    def __init__(self, by_key: Dict[str, Any]) -> None:
        self.by_key = by_key


class TelemetryEntry(_tf_private.keras_saveable()):  # type: ignore[misc]
    """The telemetry as a Keras-saveable object: saved and loaded by key."""

    def __init__(self, by_key: Dict[str, Any]) -> None:
        self._held = _Variables(by_key)

    def _obj_type(self) -> str:
        # One of the kinds Keras' saving knows; this object has no children.
        return "Optimizer"

    def save_own_variables(self, store: Any) -> None:
        """Writes each variable's value under its key."""
        for key, variable in self._held.by_key.items():
            store[key] = tf.convert_to_tensor(variable).numpy()

    def load_own_variables(self, store: Any) -> None:
        """Assigns each variable the value saved under its key, if any (a
        file written without the option holds none: the counters stay)."""
        saved = set(store.keys())
        for key, variable in self._held.by_key.items():
            if key in saved:
                variable.assign(store[key])
