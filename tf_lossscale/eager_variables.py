"""The inner optimizer's variables, made eagerly: a step is traced once.

`tf.function` traces a function twice when its first trace creates a
variable: the first trace runs under a creator that lifts each new
variable's initializer out of the graph, and because one did, TensorFlow
traces again, with variable creation forbidden, for every call after.
An inner optimizer creates its slots in its first step: tf_keras' under
`tf.init_scope()` (eagerly, yet still through that creator), Keras 3's in
the trace itself. A variable made eagerly has nothing to lift, so here it
is made without lifting, and the first trace is the one every call runs,
as when the optimizer was built before the first step. The variables,
their values and their names are those the build in the trace makes; the
first call traces half as much (a `fit` step with Adam: one trace, not two).

Under a `tf.distribute` strategy nothing changes: the strategy decides
where its variables live, and Keras builds them before the step there.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import tensorflow as tf

__all__ = ["build", "made_eagerly"]


def _not_lifted(next_creator: Callable[..., Any], **kwargs: Any) -> Any:
    if tf.executing_eagerly():
        kwargs["experimental_enable_variable_lifting"] = False
    return next_creator(**kwargs)


@contextlib.contextmanager
def made_eagerly() -> Iterator[None]:
    """Variables created in this block while executing eagerly (under
    `tf.init_scope()` in a trace) are made without lifting."""
    if tf.distribute.has_strategy():
        yield
        return
    with tf.variable_creator_scope(_not_lifted):
        yield


def build(make: Callable[[], Any]) -> None:
    """Runs `make` (it creates an optimizer's variables) eagerly when a
    trace calls it, and made without lifting; under a strategy, as is."""
    if not tf.inside_function() or tf.distribute.has_strategy():
        make()
        return
    with tf.init_scope(), made_eagerly():
        make()
