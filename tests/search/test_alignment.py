"""Alignments kept by the beam search (search/alignment.py), on a scripted model.

The scripted step's "attention" row is a function of the hypothesis's prefix and
sentence (search_fixtures.aligned_fn), so each returned alignment can be checked
exactly against the returned ids: a history left with the wrong parent after a
beam reorder, merged wrongly into the finished set, or gathered from the wrong
sentence when finished sentences leave the batch, shows. Asking for alignments
changes no id, length or score.
"""

import functools

import numpy as np
import pytest
import tensorflow as tf
from search_fixtures import (ATTENTION_WIDTH, STEPS, VOCAB, aligned_fn, expected_attention,
                             initial_cache, make_tables, scripted_fn)

from tf_transformer.search.beam_search import AlignedSearchResult, BeamSearchResult, beam_search

TABLE_SPEC = tf.TensorSpec([None, STEPS, VOCAB, 3, VOCAB], tf.float32)


@functools.lru_cache(maxsize=None)
def decoder(beam, nbest, aligned, shrink):
    max_decode_length = None if shrink else STEPS

    @tf.function(autograph=False, input_signature=[TABLE_SPEC, tf.TensorSpec([None], tf.int32)])
    def decode(tables, max_lengths):
        return beam_search(aligned_fn if aligned else scripted_fn, initial_cache(tables),
                           vocab_size=VOCAB, beam_size=beam, alpha=0.6, max_lengths=max_lengths,
                           nbest=nbest, max_decode_length=max_decode_length, shrink=shrink,
                           alignment_width=ATTENTION_WIDTH if aligned else None)

    return decode


def decode(tables, max_lengths, beam, nbest, aligned, shrink=True):
    result = decoder(beam, nbest, aligned, shrink)(tf.constant(tables),
                                                   tf.constant(max_lengths, tf.int32))
    return type(result)(*(r.numpy() for r in result))


@pytest.mark.parametrize("beam,nbest,shrink", [(1, 1, True), (4, 2, True), (4, 3, False)])
def test_alignments_follow_their_hypotheses(beam, nbest, shrink):
    """Finished sentences leaving the batch (shrink) or riding to the end (XLA's way)."""
    max_lengths = [1, 8, 5, 8, 3, 8]  # some stop at once, some by EOS, some run out
    tables = make_tables(6, len(max_lengths), eos_bias=-2.0)
    plain = decode(tables, max_lengths, beam, nbest, aligned=False, shrink=shrink)
    aligned = decode(tables, max_lengths, beam, nbest, aligned=True, shrink=shrink)
    assert isinstance(plain, BeamSearchResult) and isinstance(aligned, AlignedSearchResult)
    np.testing.assert_array_equal(aligned.ids, plain.ids)
    np.testing.assert_array_equal(aligned.lengths, plain.lengths)
    np.testing.assert_array_equal(aligned.scores, plain.scores)
    assert aligned.alignments.shape == aligned.ids.shape + (ATTENTION_WIDTH,)
    lengths = set()
    for b in range(len(max_lengths)):
        for n in range(nbest):
            length = aligned.lengths[b, n]
            lengths.add(length)
            expected = expected_attention(aligned.ids[b, n, :length], sentence=b)
            np.testing.assert_array_equal(aligned.alignments[b, n, :length], expected)
            assert not aligned.alignments[b, n, length:].any()
    assert len(lengths) > 3  # hypotheses of many lengths, finished at many steps


def test_no_alignment_without_asking():
    """The default search's step is unchanged: the model is called with 2 results
    expected, and the result has no alignments field."""
    tables = make_tables(4, 2)
    result = decode(tables, [4, 6], beam=4, nbest=2, aligned=False, shrink=True)
    assert type(result) is BeamSearchResult and "alignments" not in result._fields
