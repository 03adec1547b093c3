"""Dropout drops P_drop of the elements in every compute dtype (section 5.4: P_drop = 0.1),
its masks a pure function of the key the caller passes (layers/dropout.py)."""

import dataclasses
import random

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.config import ModelConfig
from tf_transformer.model import build_model
from tf_transformer.model.layers.dropout import Dropout

ELEMENTS = 1 << 22  # the drop fraction's standard deviation at P_drop 0.1: 1.5e-4
MODEL = ModelConfig(vocab_size=30, num_layers=2, d_model=16, d_ff=32, num_heads=2, dropout=0.1,
                    attention_dropout=0.1, relu_dropout=0.1)
# The shared embedding's; per encoder layer self-attention's weights, the FFN's ReLU and 2
# residuals; per decoder layer self- and cross-attention's weights, the ReLU and 3 residuals.
DROPOUTS = 1 + MODEL.num_layers * (1 + 1 + 2) + MODEL.num_layers * (2 + 1 + 3)


def _key(value):
    return tf.constant(value, tf.int64)


@pytest.mark.parametrize("keyed", [False, True], ids=["seed_generator", "dropout_key"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_drops_p_drop_of_the_elements_and_scales_the_rest(dtype, keyed):
    dropout = Dropout(0.1, seed=3, dtype=dtype)
    out = dropout(tf.ones([ELEMENTS // 1024, 1024], dtype), training=True,
                  dropout_key=_key(11) if keyed else None)
    out = tf.cast(out, tf.float32).numpy()
    dropped = np.mean(out == 0)
    assert dropped == pytest.approx(0.1, abs=6e-4)  # Keras's bfloat16 draw: 0.1016
    kept = np.unique(out[out != 0])
    assert kept.tolist() == [float(tf.cast(tf.constant(1 / 0.9), dtype))]
    assert np.mean(out) == pytest.approx(1.0, abs=2.5e-3)  # bfloat16's 1/0.9 is 0.16% low


def test_inference_is_the_identity_and_the_gradient_is_the_mask():
    dropout = Dropout(0.5, seed=1)
    x = tf.random.normal([64, 32])
    assert dropout(x, training=False) is x
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = dropout(x, training=True)
    kept = y.numpy() != 0
    assert 0.3 < kept.mean() < 0.7
    np.testing.assert_allclose(tape.gradient(y, x).numpy(), kept * 2.0)
    np.testing.assert_allclose(y.numpy(), np.where(kept, x.numpy() * 2.0, 0.0), rtol=1e-6)


@pytest.mark.parametrize("last_axis", [1024, 1023], ids=["paired_draws", "one_draw_each"])
def test_both_draws_drop_p_drop_independently_per_element(last_axis):
    out = Dropout(0.5, seed=7)(tf.ones([ELEMENTS // last_axis, last_axis]), training=True)
    kept = out.numpy()[:, :last_axis // 2 * 2] != 0
    assert kept.mean() == pytest.approx(0.5, abs=1e-3)
    # Neighbours (which may share one 32-bit draw) are independent: both kept a quarter.
    assert np.mean(kept[:, 0::2] & kept[:, 1::2]) == pytest.approx(0.25, abs=1e-3)


def test_a_seed_draw_decides_the_mask():
    one, two = Dropout(0.3, seed=5), Dropout(0.3, seed=5)
    x = tf.ones([16, 64])
    assert np.array_equal(one(x, training=True).numpy(), two(x, training=True).numpy())
    assert not np.array_equal(one(x, training=True).numpy(), two(x, training=False).numpy())
    assert isinstance(one, keras.layers.Dropout)  # get_config, rate and seed as Keras's


def test_a_key_decides_the_mask_and_leaves_the_seed_generator_alone():
    """Equal keys, equal masks; another key, another layer's seed or another call of the
    layer within the pass, another mask. Without a key, Keras's own draws: the layer's
    SeedGenerator advances and each call draws a new mask."""
    dropout, other = Dropout(0.3, seed=5), Dropout(0.3, seed=6)
    x = tf.ones([16, 64])

    def mask(layer=dropout, **kwargs):
        return layer(x, training=True, **kwargs).numpy() != 0

    state = dropout.seed_generator.state.numpy()
    one = mask(dropout_key=_key(1))
    np.testing.assert_array_equal(one, mask(dropout_key=_key(1)))
    for different in (mask(dropout_key=_key(2)), mask(other, dropout_key=_key(1)),
                      mask(dropout_key=_key(1), dropout_call=1)):
        assert (different != one).any() and 0.6 < different.mean() < 0.8
    np.testing.assert_array_equal(dropout.seed_generator.state.numpy(), state)
    assert (mask() != mask()).any()
    np.testing.assert_array_equal(dropout.seed_generator.state.numpy(), state + [0, 2])


def _dropouts(obj, seen=None):
    """The Dropout layers reachable through public attributes (Keras's tracking not used)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    found = [obj] if isinstance(obj, keras.layers.Dropout) else []
    if isinstance(obj, keras.layers.Layer):
        children = [v for name, v in vars(obj).items() if not name.startswith("_")]
    elif isinstance(obj, (list, tuple)):
        children = list(obj)
    elif isinstance(obj, dict):
        children = list(obj.values())
    else:
        children = []
    for child in children:
        found += _dropouts(child, seen)
    return found


def test_every_dropout_of_the_model_has_its_own_constant_fixed_by_the_seed():
    random.seed(4)
    seeds = [d.seed for d in _dropouts(build_model(MODEL))]
    assert len(seeds) == len(set(seeds)) == DROPOUTS
    random.seed(4)
    assert [d.seed for d in _dropouts(build_model(MODEL))] == seeds
    no_dropout = build_model(dataclasses.replace(MODEL, dropout=0.0, attention_dropout=0.0,
                                                 relu_dropout=0.0))
    assert {d.rate for d in _dropouts(no_dropout)} == {0.0}


def test_the_models_masks_are_a_function_of_the_key():
    """A training pass with a key is repeatable and changes with the key; without one it
    draws as Keras's Dropout does (a new mask each call); inference ignores the key."""
    model = build_model(MODEL)
    rng = np.random.default_rng(0)
    inputs = {"source": tf.constant(rng.integers(4, 30, (3, 7)), tf.int32),
              "target_in": tf.constant(rng.integers(4, 30, (3, 6)), tf.int32)}

    def logits(**kwargs):
        return model(inputs, **kwargs).numpy()

    keyed = logits(training=True, dropout_key=_key(3))
    np.testing.assert_array_equal(keyed, logits(training=True, dropout_key=_key(3)))
    np.testing.assert_array_equal(
        model.states(inputs, training=True, dropout_key=_key(3)).numpy(),
        model.states(inputs, training=True, dropout_key=_key(3)).numpy())
    assert np.abs(keyed - logits(training=True, dropout_key=_key(4))).max() > 1e-3
    assert np.abs(logits(training=True) - logits(training=True)).max() > 1e-3
    np.testing.assert_array_equal(logits(training=False),
                                  logits(training=False, dropout_key=_key(3)))


def test_relu_dropout_drops_the_hidden_activations_after_the_relu():
    """FFN(x) = W2 Dropout(max(0, x W1 + b1)) + b2 with --relu_dropout: with W2 the identity
    and b2 zero the output is the ReLU's, each element kept (scaled by 1 / (1 - p)) or 0."""
    from tf_transformer.model.layers.feed_forward import FeedForward

    ffn = FeedForward(64, 64, relu_dropout=0.25)
    ffn.build()
    ffn.outer_kernel.assign(tf.eye(64))
    x = tf.random.stateless_normal([256, 8, 64], seed=[1, 2])
    relu = tf.nn.relu(x @ ffn.inner_kernel).numpy()
    key = _key(5)
    out = ffn(x, training=True, dropout_key=key).numpy()
    dropped = (out == 0) & (relu > 0)
    assert dropped.sum() / (relu > 0).sum() == pytest.approx(0.25, abs=0.01)
    np.testing.assert_allclose(out[~dropped], relu[~dropped] / 0.75, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(ffn(x, training=True, dropout_key=key).numpy(), out)
    np.testing.assert_allclose(ffn(x, training=False).numpy(), relu, rtol=1e-5, atol=1e-6)
    # Inside, not on the output: with W2 all ones each output is the sum of the kept
    # hidden units (the same mask for the same key), equal across the output's columns.
    ffn.outer_kernel.assign(tf.ones([64, 64]))
    summed = ffn(x, training=True, dropout_key=key).numpy()
    np.testing.assert_allclose(summed, np.repeat(out.sum(-1, keepdims=True), 64, -1),
                               rtol=1e-4, atol=1e-4)


def test_relu_dropout_is_off_by_default_and_reaches_every_feed_forward():
    assert ModelConfig().relu_dropout == 0.0
    model = build_model(dataclasses.replace(MODEL, relu_dropout=0.3))
    rates = [layer.feed_forward.hidden_dropout.rate
             for stack in (model.encoder, model.decoder) for layer in stack.layers]
    assert rates == [0.3] * (2 * MODEL.num_layers)
    assert model.get_config()["relu_dropout"] == 0.3
