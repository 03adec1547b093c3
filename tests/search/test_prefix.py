"""Target prefixes (search/prefix.py): the beam search and sampling forced through each
sentence's prefix, then free, on the scripted model of search_fixtures.py (whose
log-probabilities depend on the whole history, so a forced token that did not reach
the cache, or a prefix read for the wrong sentence, changes the results)."""

import numpy as np
import pytest
import tensorflow as tf
from search_fixtures import (EOS_ID, PAD_ID, initial_cache, log_prob, make_tables,
                             next_log_probs, penalty, scripted_fn)

from tf_transformer.config import BOS_ID, UNK_ID
from tf_transformer.search import prefix as prefix_lib
from tf_transformer.search import sampling
from tf_transformer.search.beam_search import beam_search

ALPHA = 0.6
# Sentence 0: none; 1: two tokens; 2: <unk> (never generated freely below) then 5;
# 3: longer than its max length (5 tokens, max 3).
PREFIXES = [[], [4, 5], [UNK_ID, 5], [5, 4, 4, 5, 4]]
MAX_LENGTHS = [6, 6, 6, 3]


def _prefix(prefixes=PREFIXES):
    width = max(map(len, prefixes))
    ids = [p + [PAD_ID] * (width - len(p)) for p in prefixes]
    return prefix_lib.from_ids(tf.constant(ids, tf.int32, shape=[len(prefixes), width]))


def _search(tables, beam, prefix=None, shrink=None, nbest=1):
    return beam_search(scripted_fn, initial_cache(tf.constant(tables)), vocab_size=6,
                       beam_size=beam, alpha=ALPHA, max_lengths=tf.constant(MAX_LENGTHS),
                       nbest=nbest, never_ids=(UNK_ID,), shrink=shrink, prefix=prefix)


def _tokens(ids, length):
    return [int(t) for t in ids[:length]]


def _greedy(table, prefix, max_length):
    """The reference: the prefix, then the most probable token (never <unk>) until EOS."""
    tokens = list(prefix)
    while len(tokens) < max_length and (not tokens or tokens[-1] != EOS_ID):
        log_probs = next_log_probs(table, [BOS_ID] + tokens)
        log_probs[[PAD_ID, BOS_ID, UNK_ID]] = -np.inf
        tokens.append(int(np.argmax(log_probs)))
    return tokens


@pytest.mark.parametrize("shrink", [True, False])
def test_greedy_with_a_prefix_is_the_prefix_then_the_greedy_continuation(shrink):
    tables = make_tables(3, len(PREFIXES))
    result = _search(tables, 1, _prefix(), shrink)
    for b, prefix in enumerate(PREFIXES):
        max_length = max(MAX_LENGTHS[b], len(prefix) + 1)  # raised to fit the prefix and EOS
        expected = _greedy(tables[b], prefix, max_length)
        tokens = _tokens(result.ids[b, 0].numpy(), result.lengths[b, 0])
        assert tokens == expected, b
        np.testing.assert_allclose(result.scores[b, 0],
                                   log_prob(tables[b], tokens) / penalty(len(tokens), ALPHA),
                                   rtol=1e-5)


@pytest.mark.parametrize("beam", [1, 4])
def test_an_empty_prefix_is_the_free_search(beam):
    tables = make_tables(5, len(PREFIXES))
    free = _search(tables, beam, nbest=beam)
    empty = _search(tables, beam, _prefix([[]] * len(PREFIXES)), nbest=beam)
    for got, want in zip(empty, free):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_every_beam_hypothesis_starts_with_the_prefix_and_scores_the_whole_output():
    tables = make_tables(7, len(PREFIXES))
    result = _search(tables, 4, _prefix(), nbest=4)
    for b, prefix in enumerate(PREFIXES):
        kept = [n for n in range(4) if result.scores[b, n] > -np.inf]
        assert kept
        for n in kept:
            tokens = _tokens(result.ids[b, n].numpy(), result.lengths[b, n])
            assert tokens[:len(prefix)] == prefix, (b, n, tokens)
            assert UNK_ID not in tokens[len(prefix):]  # free again after the prefix
            np.testing.assert_allclose(result.scores[b, n],
                                       log_prob(tables[b], tokens) / penalty(len(tokens), ALPHA),
                                       rtol=1e-5)
    # sentence 3's prefix is longer than its max length (3): kept whole, and one token more
    assert int(result.lengths[3, 0]) == len(PREFIXES[3]) + 1


def test_the_beam_with_a_prefix_beats_no_hypothesis_of_its_own_prefix():
    """Forcing the free search's first token: the forced search's best scores at least
    the free best (which starts with that token); greedy finds it exactly."""
    tables = make_tables(11, len(PREFIXES))
    free = _search(tables, 4)
    first = [[int(free.ids[b, 0, 0])] for b in range(len(PREFIXES))]
    forced = _search(tables, 4, _prefix(first))
    assert np.all(forced.scores.numpy() >= free.scores.numpy() - 1e-6)


def _sample(tables, prefix, seed=9):
    return sampling.sample(scripted_fn, initial_cache(tf.constant(tables)), vocab_size=6,
                           max_lengths=tf.constant(MAX_LENGTHS), seed=tf.constant(seed, tf.int64),
                           alpha=ALPHA, never_ids=(UNK_ID,), prefix=prefix)


def test_sampling_draws_after_the_prefix_and_an_empty_prefix_changes_nothing():
    tables = make_tables(13, len(PREFIXES))
    for seed in range(3):
        result = _sample(tables, _prefix(), seed)
        for b, prefix in enumerate(PREFIXES):
            tokens = _tokens(result.ids[b, 0].numpy(), result.lengths[b, 0])
            assert tokens[:len(prefix)] == prefix and UNK_ID not in tokens[len(prefix):]
            np.testing.assert_allclose(result.scores[b, 0],
                                       log_prob(tables[b], tokens) / penalty(len(tokens), ALPHA),
                                       rtol=1e-5)
        free, empty = _sample(tables, None, seed), _sample(tables, _prefix([[]] * 4), seed)
        for got, want in zip(empty, free):
            np.testing.assert_array_equal(got.numpy(), want.numpy())
