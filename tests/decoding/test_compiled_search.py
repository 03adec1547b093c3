"""The XLA search's capacity stages (compiled_search.py) give the full-batch search's outputs.

The reference is the graph-mode search that keeps every sentence
(`shrink=False`) on the unpadded batch. The batch mixes outputs of one token
(a source of a lone EOS with extra_length 0), outputs that run to their
maximum length, and outputs that end early by EOS, past and before
FIRST_CACHE_LENGTH; it is padded with filler rows to a power of two. The
decoder rows computed show that the state did move to smaller capacities.
"""

import random

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.config import EOS_ID, PAD_ID, DecodeConfig, ModelConfig
from tf_transformer.decoding import compiled_search
from tf_transformer.search.beam_search import beam_search
from tf_transformer.decoding.translator import Translator
from tf_transformer.model.transformer import build_model

VOCAB = 40
ROWS = tf.Variable(0, dtype=tf.int64, trainable=False)  # decoder rows computed


@pytest.fixture(scope="module")
def model_and_step():
    # The model and an EOS-prone decode_step whose outputs have the lengths asserted below. Keras draws initializer seeds
    # from Python's and NumPy's generators; keras.utils.set_random_seed would also call
    # tf.random.set_seed, which clears the eager kernel cache and with it the SentencePiece
    # resources of other tests in this process.
    # One layer each side: XLA compiles four loop bodies (a short and a full cache, two
    # smaller capacities), each with the decoder; a second layer made each compilation
    # ~1.6x as long and the stages' claim does not need it.
    random.seed(26)
    np.random.seed(26)
    model = build_model(ModelConfig(vocab_size=VOCAB, num_layers=1, d_model=32, d_ff=64,
                                    num_heads=4, dropout=0.0))
    decode_step = model.decode_step

    def eos_prone(ids, step, cache):  # EOS where token 5 is near the best: varied lengths
        ROWS.assign_add(tf.cast(tf.shape(ids)[0], tf.int64))
        logits, cache = decode_step(ids, step, cache)
        eos = tf.one_hot(EOS_ID, VOCAB) * (logits[:, 5:6] + 1.7 - logits[:, EOS_ID:EOS_ID + 1])
        return logits + eos, cache

    return model, eos_prone


def _source():
    """7 sentences (padded to 8): two of a lone EOS, one of 40 tokens, the rest 3 to 12."""
    rng = np.random.default_rng(0)
    source = rng.integers(4, VOCAB, size=(7, 40)).astype(np.int32)
    for row, length in enumerate([1, 40, 1, 10, 5, 3, 12]):
        source[row, length:] = PAD_ID
        source[row, length - 1] = EOS_ID
    return tf.constant(source)


def test_capacities_are_few_and_end_at_one():
    assert compiled_search.capacities(32) == [32, 8, 2]
    assert compiled_search.capacities(32, factor=2, stages=5) == [32, 16, 8, 4, 2, 1]
    assert compiled_search.capacities(1) == [1, 1, 1]
    assert [int(c) for c in compiled_search.capacities(tf.constant(1024))] == [1024, 256, 64]


@pytest.mark.parametrize("beam,nbest", [(4, 4), (1, 1)], ids=["beam4_nbest4", "greedy"])
def test_capacity_stages_give_the_full_batch_search(model_and_step, beam, nbest):
    model, decode_step = model_and_step
    source = _source()
    translator = Translator(model, None, DecodeConfig(beam_size=beam, nbest=nbest,
                                                      jit_compile=True), max_source_length=64,
                            decode_step=decode_step)
    ROWS.assign(0)
    got = translator.search(source, tf.constant(0.6), tf.constant(0), nbest)
    rows = int(ROWS.numpy())
    max_lengths = translator.max_lengths(source, 0)
    cache = model.initial_cache(model.encode(source), source)
    want = tf.function(lambda: beam_search(
        decode_step, cache, vocab_size=VOCAB, beam_size=beam, alpha=0.6,
        max_lengths=max_lengths, nbest=nbest, shrink=False), autograph=False)()
    np.testing.assert_array_equal(got.ids.numpy(), want.ids.numpy())
    np.testing.assert_array_equal(got.lengths.numpy(), want.lengths.numpy())
    np.testing.assert_allclose(got.scores.numpy(), want.scores.numpy(), rtol=1e-5, atol=1e-6)
    best = want.lengths.numpy()[:, 0]
    assert best[0] == best[2] == 1
    assert best[1] == 40 > compiled_search.FIRST_CACHE_LENGTH  # the full cache, at capacity 1
    # 8 rows until the rest is done (12 steps at most), then 1 (of 2, then 1): 40 steps of
    # 8 sentences without the stages.
    assert rows <= beam * (8 * 12 + 2 + 40), rows
    if beam > 1:  # and some stop early by EOS
        assert (want.ids.numpy() == EOS_ID).any() and len(set(want.lengths.numpy().ravel())) > 4
