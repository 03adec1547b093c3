"""attention_plot.recording: the wrapped `attention_weights` takes the layer's own
arguments (the kernel policy, positional, keyword or left to its default) and records
exactly what the layer computes."""

import numpy as np
import tensorflow as tf
from model_fixtures import tiny_config

from tf_transformer.cli import attention_plot
from tf_transformer.model import build_model, kernels


def test_recording_passes_the_kernel_policy_through():
    model = build_model(tiny_config(vocab_size=64).model)
    model({"source": tf.constant([[5, 6, 3]]), "target_in": tf.constant([[2, 7]])},
          training=False)
    attention = model.encoder.layers[0].self_attention
    q, k = tf.random.stateless_normal([2, 1, 4, 3, 8], seed=[1, 2])
    bias = tf.zeros([1, 1, 1, 3])
    expected = attention.attention_weights(q, k, bias).numpy()
    with attention_plot.recording(model) as records:
        for call in (lambda: attention.attention_weights(q, k, bias),
                     lambda: attention.attention_weights(q, k, bias, kernels.STEP),
                     lambda: attention.attention_weights(q, k, bias, kernels=kernels.ENCODING)):
            records["encoder_self"][0] = None
            np.testing.assert_allclose(call().numpy(), expected, atol=1e-6)
            np.testing.assert_allclose(np.asarray(records["encoder_self"][0]), expected,
                                       atol=1e-6)
    assert "attention_weights" not in attention.__dict__
