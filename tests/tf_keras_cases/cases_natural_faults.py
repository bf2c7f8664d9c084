

def test_the_deep_look_names_the_attention_logits_forward():
    import tensorflow as tf

    from tf_lossscale import deep_look
    x, y = nf.data()
    model = nf.attention(tf_keras)
    found = deep_look.first_nonfinite_op(
        lambda: tf.reduce_mean(model(x[:nf.BATCH].reshape(-1, 4, 2))
                               - y[:nf.BATCH]),
        model.trainable_variables, 2.0**10)
    assert (found.backward, found.dtype) == (False, "float16")
    assert "attend" in found.op, found
