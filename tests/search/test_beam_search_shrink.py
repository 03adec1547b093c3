"""Dropping finished sentences (decoding/live_rows.py) changes nothing but the work done.

The reference is the same search with `shrink=False`: every sentence rides in
the batch until the slowest is done (the search before live_rows). Batches mix
sentences that stop at their first token, run to their maximum length, or stop
early by EOS, plus filler rows (copies of the last sentence, as compiled_search
pads a batch). The scripted model reads a per-sentence random table held in
the cache (like encoder memory), so a row gathered from the wrong sentence or
parent changes the outputs. Scores may differ in the last bit of float32
(kernels round differently for another number of rows); ids and lengths not.
"""

import functools
from typing import NamedTuple

import random

import numpy as np
import pytest
import tensorflow as tf
from search_fixtures import TableCache

from tf_transformer.config import BOS_ID, EOS_ID, PAD_ID, ModelConfig
from tf_transformer.search import live_rows
from tf_transformer.search.beam_search import beam_search
from tf_transformer.model import cache as caches
from tf_transformer.model.transformer import build_model

VOCAB = 7
STEPS = 9
ROWS = tf.Variable(0, dtype=tf.int64, trainable=False)  # row-steps the model computed
TABLE_SPEC = tf.TensorSpec([None, STEPS, VOCAB, VOCAB], tf.float32)
# Sentence 0 and 2 stop at one token, 1 and 3 run to 9 tokens, 4 and 5 likely stop by
# EOS early, and 6, 7 are filler rows repeating sentence 5.
MAX_LENGTHS = [1, 9, 1, 9, 9, 7, 7, 7]
EOS_BIAS = [0.0, -1e9, 0.0, -1e9, 3.0, 1.0, 1.0, 1.0]


def make_tables(seed):
    rng = np.random.default_rng(seed)
    table = rng.normal(size=(6, STEPS, VOCAB, VOCAB)) * 2.0
    table = np.concatenate([table, table[-1:], table[-1:]])  # filler rows
    table[..., EOS_ID] += np.asarray(EOS_BIAS)[:, None, None]
    table[..., PAD_ID] = table[..., BOS_ID] = -1e9
    return table.astype(np.float32)


class RigidCache(NamedTuple):
    """A BeamCache without `compact`: the search must keep every sentence."""

    memory: tf.Tensor
    sum: tf.Tensor
    tile = TableCache.tile
    reorder = TableCache.reorder


def table_fn(ids, step, cache):
    ROWS.assign_add(tf.cast(tf.shape(ids)[0], tf.int64))
    prefix_sum = cache.sum + ids[:, step]
    rows = tf.range(tf.shape(ids)[0])
    index = tf.stack([rows, tf.fill(tf.shape(rows), step), prefix_sum % VOCAB], axis=1)
    return tf.gather_nd(cache.memory, index), cache._replace(sum=prefix_sum)


def dict_fn(ids, step, cache):
    logits, cache = table_fn(ids, step, TableCache(**cache))
    return logits, cache._asdict()


@functools.lru_cache(maxsize=None)
def decoder(beam, nbest, shrink, cache="object", jit=False):
    fn = dict_fn if cache == "dict" else table_fn
    make = {"object": TableCache, "rigid": RigidCache,
            "dict": lambda memory, sum: {"memory": memory, "sum": sum}}[cache]

    @tf.function(autograph=False, jit_compile=jit, input_signature=[TABLE_SPEC, tf.TensorSpec([None], tf.int32)])
    def decode(tables, max_lengths):
        initial = make(memory=tables, sum=tf.zeros([tf.shape(tables)[0]], tf.int32))
        return beam_search(fn, initial, vocab_size=VOCAB, beam_size=beam, alpha=0.6,
                           max_lengths=max_lengths, nbest=nbest, shrink=shrink,
                           max_decode_length=STEPS if jit else None)

    return decode


def run(beam, nbest, shrink, seed=0, **kwargs):
    ROWS.assign(0)
    result = decoder(beam, nbest, shrink, **kwargs)(tf.constant(make_tables(seed)),
                                                    tf.constant(MAX_LENGTHS, tf.int32))
    return [r.numpy() for r in result], int(ROWS.numpy())


def assert_same(got, want):
    """ids and lengths exact; scores to the last bits (TensorFlow's CPU kernels,
    log_softmax among them, may round differently for another number of rows)."""
    ids, scores, lengths = got
    np.testing.assert_array_equal(ids, want[0])
    np.testing.assert_array_equal(lengths, want[2])
    np.testing.assert_allclose(scores, want[1], rtol=1e-6, atol=0)


@pytest.mark.parametrize("beam,nbest", [(4, 4), (1, 1)], ids=["beam4_nbest4", "greedy"])
@pytest.mark.parametrize("cache", ["object", "dict"])
@pytest.mark.parametrize("seed", [0, 1])
def test_shrinking_gives_the_full_batch_search_with_fewer_rows(beam, nbest, cache, seed):
    want, full_rows = run(beam, nbest, shrink=False, seed=seed, cache=cache)
    got, rows = run(beam, nbest, shrink=True, seed=seed, cache=cache)
    assert_same(got, want)
    lengths = want[2]
    assert lengths[0, 0] == lengths[2, 0] == 1 and lengths[1, 0] == lengths[3, 0] == 9
    # The first step runs one row per sentence (only slot 0 is alive), then the
    # slowest sentence holds the whole batch.
    assert full_rows == 8 + 8 * 8 * beam
    assert rows < full_rows * 0.8, (rows, full_rows)


def test_a_cache_without_compact_keeps_every_sentence():
    # beam 4, nbest 4: the reference search is the one the tests above traced
    want, full_rows = run(4, 4, shrink=False)
    got, rows = run(4, 4, shrink=True, cache="rigid")
    assert not live_rows.can_compact(RigidCache(tf.zeros([1]), tf.zeros([1])))
    assert_same(got, want)
    assert rows == full_rows


def test_shrink_defaults_on_without_a_static_buffer():
    got, rows = run(4, 4, shrink=None)
    want, full_rows = run(4, 4, shrink=False)
    assert_same(got, want)
    assert rows < full_rows


def test_pack_keeps_live_rows_first_and_results_in_place():
    """live_rows.pack, XLA's move to a smaller capacity, under jit_compile."""
    want, _ = run(4, 4, shrink=False)

    @tf.function(autograph=False, jit_compile=True, input_signature=[TABLE_SPEC, tf.TensorSpec([8], tf.int32)])
    def staged(tables, max_lengths):
        from tf_transformer.search.beam_search import BeamSearch
        search = BeamSearch(table_fn, vocab_size=VOCAB, beam_size=4, alpha=0.6,
                            max_lengths=max_lengths, nbest=4, max_decode_length=STEPS)
        state = search.start(TableCache(tables, tf.zeros([8], tf.int32)))
        for capacity in (4, 2, 1):
            state = search.advance(state, live_above=capacity)
            state = live_rows.pack(state, capacity, beam=4)
        return search.finish(search.advance(state))

    got = staged(tf.constant(make_tables(0)), tf.constant(MAX_LENGTHS, tf.int32))
    assert_same([r.numpy() for r in got], want)


def test_tiny_model_shrinking_gives_the_same_outputs():
    """The real decoder and DecoderCache.compact: 1-token, full-length and EOS-ended outputs."""
    # Weights whose outputs have the lengths asserted below (best: 1, 1, 1, 12, 6, 12 tokens).
    # Keras draws initializer seeds from Python's and NumPy's generators;
    # keras.utils.set_random_seed would also call tf.random.set_seed, which clears the
    # eager kernel cache and with it the SentencePiece resources of other tests in this
    # process. One layer each side: the claim is about the search's rows, and each of the
    # two searches traces the decoder layers.
    random.seed(3)
    np.random.seed(3)
    model = build_model(ModelConfig(vocab_size=40, num_layers=1, d_model=32, d_ff=64,
                                    num_heads=4, dropout=0.0))
    rng = np.random.default_rng(3)
    source = rng.integers(4, 40, size=(6, 7)).astype(np.int32)
    source[:, -1] = EOS_ID
    source[2, 3:] = PAD_ID
    source = tf.constant(source)
    max_lengths = tf.constant([1, 12, 1, 12, 6, 12], tf.int32)

    def eos_prone(ids, step, cache):  # EOS where token 5 is near the best: varied lengths
        logits, cache = model.decode_step(ids, step, cache)
        eos = tf.one_hot(EOS_ID, 40) * (logits[:, 5:6] + 1.7 - logits[:, EOS_ID:EOS_ID + 1])
        return logits + eos, cache

    @tf.function(autograph=False)
    def decode(shrink):
        cache = model.initial_cache(model.encode(source), source, caches.growing())
        return beam_search(eos_prone, cache, vocab_size=40, beam_size=4, alpha=0.6,
                           max_lengths=max_lengths, nbest=4, shrink=shrink)

    want, got = decode(False), decode(True)
    np.testing.assert_array_equal(got.ids.numpy(), want.ids.numpy())
    np.testing.assert_array_equal(got.lengths.numpy(), want.lengths.numpy())
    np.testing.assert_allclose(got.scores.numpy(), want.scores.numpy(), rtol=1e-5, atol=1e-6)
    best = want.lengths.numpy()[:, 0]
    assert best[0] == best[2] == 1
    assert len(set(want.lengths.numpy().ravel())) > 3  # varied lengths
    assert (want.ids.numpy() == EOS_ID).any()  # some hypotheses ended by EOS
