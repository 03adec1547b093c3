"""One shared check applied to every layer of model/layers (keras-hub's run_layer_test habit):
config round trip, parameter count against the closed form, one fit step that
changes every weight, and a mixed_bfloat16 forward pass (float32 weights; float32
outputs where the model keeps them: logits, attention weights).

The fit step runs eagerly (run_eagerly): whether every weight receives a gradient and
moves does not depend on the step being a graph, and tracing and optimising Keras' train
function was most of each case's time (a graph step would cost ~5x as much for the stacks).
The graph-mode training step of the whole model is the training tests'."""

from typing import Callable, NamedTuple

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.model import masks
from tf_transformer.model.layers import (
    CrossAttention,
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    FeedForward,
    LearnedPositions,
    SelfAttention,
    TokenAndPositionEmbedding,
)

B, T, S, D, H, DK, DV, FF, V, P = 2, 3, 5, 16, 2, 4, 6, 24, 30, 7
ATTENTION = D * H * (2 * DK + DV) + H * (2 * DK + DV) + H * DV * D + D  # projections + biases
FFN = D * FF + FF + FF * D + D
NORM = 2 * D
ENCODER_LAYER = ATTENTION + FFN + 2 * NORM
DECODER_LAYER = 2 * ATTENTION + FFN + 3 * NORM
STACK = dict(d_model=D, num_heads=H, d_k=DK, d_v=DV, d_ff=FF, dropout=0.1)


def _inputs():
    rng = np.random.default_rng(0)
    source = rng.integers(4, V, size=(B, S))
    source[1, 3:] = 0
    return {"x": tf.constant(rng.normal(size=(B, T, D)), tf.float32),
            "memory": tf.constant(rng.normal(size=(B, S, D)), tf.float32),
            "positions": tf.constant(rng.normal(size=(B, P, D)), tf.float32),
            "ids": tf.constant(rng.integers(4, V, size=(B, T)), tf.int32),
            "source_bias": masks.attention_bias(masks.padding_mask(tf.constant(source)))}


def _causal(x):
    return masks.attention_bias(masks.causal_mask(tf.shape(x)[1]))


class Case(NamedTuple):
    make: Callable  # **kwargs (dtype) -> layer
    forward: Callable  # (layer, inputs, training) -> tensor
    params: int  # closed form
    mixed_dtype: str = "bfloat16"  # output dtype under mixed_bfloat16


CASES = {
    "SelfAttention": Case(
        lambda **kw: SelfAttention(D, H, DK, DV, 0.1, **kw),
        lambda l, i, t: l(i["x"], _causal(i["x"]), training=t), ATTENTION),
    "CrossAttention": Case(
        lambda **kw: CrossAttention(D, H, DK, DV, 0.1, **kw),
        lambda l, i, t: l(i["x"], i["memory"], i["source_bias"], training=t), ATTENTION),
    "FeedForward": Case(lambda **kw: FeedForward(D, FF, **kw), lambda l, i, t: l(i["x"]), FFN),
    "EncoderLayer": Case(
        lambda **kw: EncoderLayer(**STACK, **kw),
        lambda l, i, t: l(i["memory"], i["source_bias"], training=t), ENCODER_LAYER),
    "DecoderLayer": Case(
        lambda **kw: DecoderLayer(**STACK, pre_norm=True, **kw),
        lambda l, i, t: l(i["x"], i["memory"], _causal(i["x"]), i["source_bias"], training=t),
        DECODER_LAYER),
    "Encoder": Case(
        lambda **kw: Encoder(num_layers=2, **STACK, pre_norm=True, **kw),
        lambda l, i, t: l(i["memory"], i["source_bias"], training=t), 2 * ENCODER_LAYER + NORM),
    "Decoder": Case(
        lambda **kw: Decoder(num_layers=2, **STACK, **kw),
        lambda l, i, t: l(i["x"], i["memory"], _causal(i["x"]), i["source_bias"], training=t),
        2 * DECODER_LAYER),
    "LearnedPositions": Case(
        lambda **kw: LearnedPositions(P, D, **kw),
        lambda l, i, t: i["positions"] + tf.cast(l(tf.constant(P))[tf.newaxis], tf.float32),
        P * D, "float32"),
    "TokenAndPositionEmbedding": Case(
        lambda **kw: TokenAndPositionEmbedding(V, D, "learned", P, 0.1, **kw),
        lambda l, i, t: l(i["ids"], training=t), V * D + P * D),
    "TokenAndPositionEmbedding.logits": Case(
        lambda **kw: TokenAndPositionEmbedding(V, D, "sinusoid", P, 0.0, **kw),
        lambda l, i, t: l.logits(l(i["ids"], training=t)), V * D, "float32"),
}


class Harness(keras.Model):
    """Wraps one layer so that Model.fit can train it."""

    def __init__(self, layer, forward):
        super().__init__()
        self.layer, self.forward = layer, forward

    def call(self, inputs, training=None):
        return self.forward(self.layer, inputs, training)


def _built(case, **kwargs):
    layer = case.make(**kwargs)
    layer.build()
    return layer


@pytest.mark.parametrize("name", CASES)
def test_layer(name):
    case, inputs = CASES[name], _inputs()
    layer = _built(case)
    expected = case.forward(layer, inputs, False).numpy()

    # Config round trip: the clone has the same config and, with the weights, the same output.
    clone = layer.__class__.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()
    clone.build()
    clone.set_weights(layer.get_weights())
    np.testing.assert_array_equal(case.forward(clone, inputs, False).numpy(), expected)

    assert layer.count_params() == case.params

    # Mixed precision: float32 variables, the compute dtype (or float32) out, close to float32.
    mixed = _built(case, dtype="mixed_bfloat16")
    mixed.set_weights(layer.get_weights())
    assert all(w.dtype == "float32" for w in mixed.weights)
    output = case.forward(mixed, inputs, False)
    assert output.dtype == case.mixed_dtype
    error = np.abs(tf.cast(output, tf.float32).numpy() - expected).max()
    assert error < 0.05 * np.abs(expected).max() + 0.05, error

    # One fit step moves every weight.
    before = [w.numpy().copy() for w in layer.trainable_weights]
    harness = Harness(layer, case.forward)
    harness.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse", run_eagerly=True)
    target = np.random.default_rng(1).normal(size=expected.shape).astype(np.float32)
    harness.fit(inputs, target, batch_size=B, epochs=1, verbose=0)
    for old, new in zip(before, layer.trainable_weights):
        assert not np.array_equal(old, new.numpy()), new.path


def test_attention_weights_stay_float32_under_mixed_precision():
    inputs = _inputs()
    layer = SelfAttention(D, H, DK, DV, dtype="mixed_bfloat16")
    layer.build()
    q, k, _ = layer.project(tf.cast(inputs["x"], tf.bfloat16))  # as the embedding hands it on
    assert q.dtype == tf.bfloat16
    weights = layer.attention_weights(q, k, _causal(inputs["x"]))
    assert weights.dtype == tf.float32
    np.testing.assert_allclose(tf.reduce_sum(weights, -1).numpy(), 1.0, atol=1e-6)
