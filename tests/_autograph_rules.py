"""TensorFlow 2.17+ lists tf_keras among the modules AutoGraph leaves as
they are; TensorFlow 2.16 (the oldest stack CI tests) converts every tf_keras
function a traced step calls, about 20 s per `fit` or `evaluate` on two
cores. Test processes that run tf_keras add that rule where it is missing,
so the oldest stack traces as the newer ones do; what a step computes does
not change.
"""


def leave_tf_keras_unconverted() -> None:
    """Adds TensorFlow 2.17's `DoNotConvert('tf_keras')` rule if absent."""
    from tensorflow.python.autograph.core import config

    rules = tuple(config.CONVERSION_RULES)
    if not any(rule.matches("tf_keras") and isinstance(
            rule, config.DoNotConvert) for rule in rules):
        config.CONVERSION_RULES = (config.DoNotConvert("tf_keras"),) + rules
