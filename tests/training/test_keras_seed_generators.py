"""Guards the Keras private API behind training/keras_seed_generators.py (Keras 3.15).

If Keras renames `Layer._flatten_layers` or `Layer._seed_generators`, or stops
drawing a Dropout's seed through its generator's `next`, these tests fail; the
trainer would otherwise silently draw the same masks on every replica again.
"""

import dataclasses

import keras
import numpy as np
import tensorflow as tf

from tf_transformer.config import ModelConfig
from tf_transformer.model import build_model
from tf_transformer.training import keras_seed_generators
from tf_transformer.training.seeds import ReplicaSeeds

MODEL = ModelConfig(vocab_size=30, num_layers=2, d_model=16, d_ff=32, num_heads=2, dropout=0.1,
                    attention_dropout=0.1)
# The shared embedding's; per encoder layer self-attention's weights and 2 residuals; per
# decoder layer self- and cross-attention's weights and 3 residuals.
DROPOUTS = 1 + MODEL.num_layers * (1 + 2) + MODEL.num_layers * (2 + 3)


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


def _mask(dropout):
    return dropout(tf.ones([8, 64]), training=True).numpy() != 0


def test_finds_exactly_the_models_dropout_generators():
    model = build_model(MODEL)
    dropouts = _dropouts(model)
    assert len(dropouts) == DROPOUTS
    found = keras_seed_generators.seed_generators(model)
    assert len(found) == len({id(g) for g in found}) == DROPOUTS  # each once
    assert {id(g) for g in found} == {id(d.seed_generator) for d in dropouts}
    no_dropout = build_model(dataclasses.replace(MODEL, dropout=0.0, attention_dropout=0.0))
    assert keras_seed_generators.seed_generators(no_dropout) == []


def test_a_redirected_next_decides_the_dropout_mask():
    dropout = build_model(MODEL).target_embedding.embedding_dropout
    generator = dropout.seed_generator
    seeds = [[1, 2], [1, 2], [1, 3], None, None]  # None: Keras's own draw
    calls = []

    def replacement(original, ordered):
        calls.append(ordered)
        seed = seeds[len(calls) - 1]
        return original(ordered=ordered) if seed is None else tf.constant(
            seed, generator.state.dtype)

    keras_seed_generators.redirect_next(generator, replacement)
    state = generator.state.numpy()
    a, a_again, b = _mask(dropout), _mask(dropout), _mask(dropout)
    assert calls == [True] * 3  # one draw per call, through the replacement
    np.testing.assert_array_equal(a, a_again)
    assert (a != b).any() and 0.05 < 1 - a.mean() < 0.2  # rate 0.1
    np.testing.assert_array_equal(generator.state.numpy(), state)  # Keras's state not drawn
    c, d = _mask(dropout), _mask(dropout)
    assert len(calls) == 5 and (c != d).any()
    np.testing.assert_array_equal(generator.state.numpy(), state + [0, 2])  # Keras's own next


def test_replica_seeds_pick_the_mask_in_a_scope_and_keras_draws_outside():
    model = build_model(MODEL)
    seeds = ReplicaSeeds(model)
    assert len(seeds.generators) == DROPOUTS
    dropout = model.target_embedding.embedding_dropout
    state = dropout.seed_generator.state.numpy()

    def under(key):
        with seeds.scope(tf.constant(key, tf.int64)):
            return _mask(dropout)

    one, two, one_again = under(1), under(2), under(1)
    np.testing.assert_array_equal(one, one_again)  # same key, same mask
    assert (one != two).any()  # another key, another mask
    np.testing.assert_array_equal(dropout.seed_generator.state.numpy(), state)
    outside = [_mask(dropout), _mask(dropout)]
    assert (outside[0] != outside[1]).any()
    np.testing.assert_array_equal(dropout.seed_generator.state.numpy(), state + [0, 2])
