"""A test helper of the tf_keras cases: an identity that checks its gradient.

The originals' tests check the gradient that reaches the loss (the loss
scale divided by the replicas); this is how ours do it, eagerly, inside
`tf.function` and in every replica.
"""

import tensorflow as tf


def identity_checking_its_gradient(expected, calls):
    """The identity, whose backward pass asserts that the gradient it gets
    is `expected` everywhere; `calls` grows by one each time the gradient
    function runs (or is traced), so a test can tell the check took place.
    """
    @tf.custom_gradient
    def identity(x):
        def grad(upstream):
            calls.append(1)
            check = tf.debugging.assert_equal(
                upstream, tf.fill(tf.shape(upstream),
                                  tf.cast(expected, upstream.dtype)),
                message="the gradient reaching the loss")
            with tf.control_dependencies([check]):
                return tf.identity(upstream)
        return tf.identity(x), grad
    return identity
