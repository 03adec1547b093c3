"""LayerNorm's closed-form training gradient equals TensorFlow's differentiation of Keras's
LayerNormalization, in float32 and in mixed precision; outside training the layer is Keras's."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.config import ModelConfig
from tf_transformer.model.layers.layer_norm import LayerNormalization
from tf_transformer.model.transformer import build_model

D = 24


def _pair(dtype):
    """Ours and Keras's LayerNormalization with the same non-trivial gamma and beta."""
    rng = np.random.default_rng(0)
    ours = LayerNormalization(epsilon=1e-6, dtype=dtype)
    keras_norm = keras.layers.LayerNormalization(epsilon=1e-6, dtype=dtype)
    for layer in (ours, keras_norm):
        layer.build((None, None, D))
        layer.gamma.assign(rng.normal(1.0, 0.3, size=D).astype(np.float32))
        layer.beta.assign(np.linspace(-0.5, 0.5, D, dtype=np.float32))
        rng = np.random.default_rng(0)
    return ours, keras_norm


def _output_and_gradients(layer, x, upstream, training):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x, training=training)
        objective = tf.reduce_sum(tf.cast(y, tf.float32) * upstream)
    dx, dgamma, dbeta = tape.gradient(objective, [x, layer.gamma, layer.beta])
    return [np.asarray(tf.cast(t, tf.float32)) for t in (y, dx, dgamma, dbeta)]


@pytest.mark.parametrize("dtype, tolerance", [("float32", 2e-5), ("mixed_bfloat16", 2e-2)])
def test_training_values_and_gradients_equal_kerass(dtype, tolerance):
    ours, keras_norm = _pair(dtype)
    rng = np.random.default_rng(1)
    compute = keras.DTypePolicy(dtype).compute_dtype
    # Rows of very different offsets and scales: the statistics matter.
    x = tf.cast(rng.normal(size=(3, 5, D)) * rng.uniform(0.1, 5, size=(3, 5, 1))
                + rng.normal(size=(3, 5, 1)) * 3, compute)
    upstream = tf.constant(rng.normal(size=(3, 5, D)), tf.float32)
    got = _output_and_gradients(ours, x, upstream, training=True)
    want = _output_and_gradients(keras_norm, x, upstream, training=True)
    assert got[0].dtype == want[0].dtype
    for name, g, w in zip(("y", "dx", "dgamma", "dbeta"), got, want):
        scale = max(1.0, float(np.max(np.abs(w))))
        np.testing.assert_allclose(g, w, atol=tolerance * scale, err_msg=name)
    # The gradient with respect to x sums to zero over the normalised axis.
    assert np.max(np.abs(got[1].sum(-1))) < 50 * tolerance * np.max(np.abs(got[1]))


def test_outside_training_it_is_kerass_layer_op_for_op():
    ours, keras_norm = _pair("float32")
    x = tf.random.stateless_normal([2, 7, D], seed=[1, 2])
    assert np.array_equal(ours(x, training=False).numpy(), keras_norm(x).numpy())

    def op_types(layer):
        graph = tf.function(lambda t: layer(t)).get_concrete_function(
            tf.TensorSpec([None, None, D])).graph
        return sorted(op.type for op in graph.get_operations())
    assert op_types(ours) == op_types(keras_norm)


def test_every_norm_of_the_model_is_this_layer():
    model = build_model(ModelConfig(num_layers=2, d_model=D, d_ff=32, num_heads=2,
                                    vocab_size=40, pre_norm=True))
    norms = [layer for layer in model._flatten_layers()
             if isinstance(layer, keras.layers.LayerNormalization)]
    assert len(norms) == 2 * 2 + 2 * 3 + 2  # encoder and decoder sub-layers, final norms
    assert all(isinstance(layer, LayerNormalization) for layer in norms)
