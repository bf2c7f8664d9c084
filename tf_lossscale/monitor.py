"""`LossScaleMonitor`: the loss scale and the skipped steps in fit's logs.

A Keras callback for Keras 3 and tf_keras models alike. After each batch and
each epoch it adds `loss_scale` and `skipped_steps` (read from the model's
`tf_lossscale.LossScaleOptimizer`) to the `logs` dict that the callbacks
after it receive, so they show in the progress bar, `History`, `CSVLogger`
and Keras' `TensorBoard` callback. It reads two scalars once per batch, after
the step has run: the step itself gains no host sync.

With `max_consecutive_skips=K` it stops training after K skipped steps in a
row and warns once: a scale that keeps falling while every step is skipped
is a NaN or Inf that no loss scale can fix (bad data or a bug), not float16
overflow.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, Optional

import keras

from tf_lossscale import _checks
from tf_lossscale import optimizer as optimizer_lib

__all__ = ["LossScaleMonitor"]


class LossScaleMonitor(keras.callbacks.Callback):
    """Logs `loss_scale` and `skipped_steps`; optionally stops on a skip run.

    Put it before the callbacks that should see its values (`CSVLogger`,
    `TensorBoard`); `fit`'s progress bar and `History` see them anyway.

    Args:
      max_consecutive_skips: None (never stop), or an int >= 1: stop
        training (`model.stop_training = True`) after that many skipped
        steps in a row, with a warning naming the step and the scale.

    Raises:
      ValueError: `max_consecutive_skips` is not None or an int >= 1.
    """

    def __init__(self, max_consecutive_skips: Optional[int] = None) -> None:
        super().__init__()
        if max_consecutive_skips is not None:
            max_consecutive_skips = _checks.check_int(
                "max_consecutive_skips", max_consecutive_skips, minimum=1)
        self.max_consecutive_skips = max_consecutive_skips
        self._last_skipped: Optional[int] = None
        self._run = 0
        self._warned = False

    # tf_keras' CallbackList asks every callback which hooks it implements.
    _supports_tf_logs = False

    def _implements_train_batch_hooks(self) -> bool:
        return True

    def _implements_test_batch_hooks(self) -> bool:
        return False

    def _implements_predict_batch_hooks(self) -> bool:
        return False

    def _optimizer(self) -> optimizer_lib.LossScaleOptimizer:
        optimizer = getattr(self.model, "optimizer", None)
        if not isinstance(optimizer, optimizer_lib.LossScaleOptimizer):
            raise TypeError(
                "LossScaleMonitor needs a model compiled with a "
                "tf_lossscale.LossScaleOptimizer; got optimizer "
                f"{optimizer!r} of type {type(optimizer).__name__}.")
        return optimizer

    def _add_to(self, logs: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        optimizer = self._optimizer()
        values = {"loss_scale": float(optimizer.loss_scale),
                  "skipped_steps": int(optimizer.skipped_steps)}
        if logs is not None:
            logs.update(values)
        return values

    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        self._last_skipped = int(self._optimizer().skipped_steps)
        self._run = 0
        self._warned = False

    def on_train_batch_end(self, batch: int,
                           logs: Optional[Dict[str, Any]] = None) -> None:
        values = self._add_to(logs)
        skipped = values["skipped_steps"]
        new = skipped - (self._last_skipped or 0)
        self._last_skipped = skipped
        # A batch may hold several steps (steps_per_execution): a run
        # continues only while every step of a batch was skipped.
        self._run = self._run + new if new else 0
        if (self.max_consecutive_skips is not None
                and self._run >= self.max_consecutive_skips):
            self._stop(batch, values["loss_scale"])

    def on_epoch_end(self, epoch: int,
                     logs: Optional[Dict[str, Any]] = None) -> None:
        self._add_to(logs)

    def _stop(self, batch: int, scale: float) -> None:
        self.model.stop_training = True
        if self._warned:
            return
        self._warned = True
        optimizer = self._optimizer()
        warnings.warn(
            f"LossScaleMonitor stopped training at batch {batch} (step "
            f"{int(optimizer.iterations)}): the last {self._run} steps were "
            f"all skipped for NaN/Inf gradients and the loss scale is now "
            f"{scale:g}. A NaN or Inf that persists at a low scale is not "
            "float16 overflow: look for bad input data, a log or division of "
            "zero, or a learning rate that diverges.", RuntimeWarning,
            stacklevel=2)
