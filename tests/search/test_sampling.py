"""Sampling (search/sampling.py) on scripted logits: what the filters keep, that only
kept tokens are drawn and with the filtered distribution's frequencies, seeds,
scores, and the limits that are greedy decoding."""

import functools

import numpy as np
import pytest
import tensorflow as tf
from search_fixtures import (STEPS, TOKENS, VOCAB, initial_cache, log_prob, log_softmax,
                             make_tables, next_log_probs, penalty, scripted_fn)

from tf_transformer.config import BOS_ID, EOS_ID, PAD_ID
from tf_transformer.search import sampling
from tf_transformer.search.beam_search import beam_search

TABLE_SPEC = tf.TensorSpec([None, STEPS, VOCAB, 3, VOCAB], tf.float32)
SCALAR = tf.TensorSpec([], tf.float32)


def _filter(logits, topk=0, topp=0.0, temperature=1.0):
    out = sampling.filter_logits(tf.constant(logits, tf.float32), topk, topp, temperature)
    return out.numpy()


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = np.array([0.05, 0.5, 0.1, 0.2, 0.15])  # by rank: 1, 3, 4, 2, 0
    log_probs = np.log(probs)[np.newaxis]
    kept = {p: set(np.flatnonzero(np.isfinite(_filter(log_probs, topp=p)[0])))
            for p in (0.3, 0.6, 0.75, 0.9, 0.99)}
    assert kept == {0.3: {1}, 0.6: {1, 3}, 0.75: {1, 3, 4}, 0.9: {1, 3, 4, 2},
                    0.99: {0, 1, 2, 3, 4}}
    filtered = _filter(log_probs, topp=0.6)[0]
    np.testing.assert_allclose(filtered[[1, 3]], log_probs[0, [1, 3]], rtol=1e-6)  # unchanged
    # Off at 0 and at 1; top-k keeps the k best, the lower id first among equals.
    np.testing.assert_array_equal(_filter(log_probs, topp=0.0), _filter(log_probs, topp=1.0))
    assert np.isfinite(_filter(log_probs, topp=1.0)).all()
    tied = np.log([[0.2, 0.3, 0.3, 0.2]])
    assert list(np.flatnonzero(np.isfinite(_filter(tied, topk=1)[0]))) == [1]
    assert list(np.flatnonzero(np.isfinite(_filter(tied, topk=3)[0]))) == [0, 1, 2]


def test_filters_match_a_numpy_reference():
    """Temperature, then top-k, then top-p over the renormalized rest."""
    rng = np.random.default_rng(0)
    log_probs = np.stack([log_softmax(rng.normal(size=50) * 2) for _ in range(20)])
    for topk, topp, temperature in [(0, 0.8, 1.0), (10, 0.0, 0.5), (7, 0.5, 2.0), (3, 0.95, 1.0)]:
        got = np.isfinite(_filter(log_probs, topk, topp, temperature))
        for row, expected in zip(got, _reference_kept(log_probs, topk, topp, temperature)):
            assert set(np.flatnonzero(row)) == expected


def _reference_kept(log_probs, topk, topp, temperature):
    for row in log_probs:
        order = np.argsort(-row, kind="stable")
        if topk:
            order = order[:topk]
        if topp:
            probs = np.exp(row[order] / temperature)
            probs /= probs.sum()
            before = np.cumsum(probs) - probs
            order = order[before < topp]
        yield set(order)


def test_draws_follow_the_filtered_distribution():
    """20000 draws of one row: frequencies within 0.015 of the tempered, filtered
    probabilities; a filtered-out token never appears."""
    log_probs = np.log(np.array([[0.02, 0.4, 0.08, 0.3, 0.2]], np.float32))
    rows = np.repeat(log_probs, 20000, axis=0)
    for topk, topp, temperature in [(0, 0.0, 1.0), (3, 0.0, 2.0), (0, 0.75, 0.5)]:
        config = sampling.SamplingConfig(None, 5, 0.0, topk, topp, temperature,
                                         tf.constant(7, tf.int64), EOS_ID, BOS_ID)
        tokens = sampling.draw(tf.constant(rows), config, 3, tf.range(20000), 20000).numpy()
        logits = _filter(log_probs, topk, topp, temperature)[0]
        expected = np.exp(logits - logits.max())
        expected /= expected.sum()
        frequencies = np.bincount(tokens, minlength=5) / len(tokens)
        np.testing.assert_allclose(frequencies, expected, atol=0.015)
        assert not frequencies[expected == 0].any()


@functools.lru_cache(maxsize=None)
def sampler(shrink=True):
    @tf.function(autograph=False, input_signature=[TABLE_SPEC, tf.TensorSpec([None], tf.int32),
                                  tf.TensorSpec([], tf.int64), tf.TensorSpec([], tf.int32),
                                  SCALAR, SCALAR])
    def run(tables, max_lengths, seed, topk, topp, temperature):
        return sampling.sample(scripted_fn, initial_cache(tables), vocab_size=VOCAB,
                               max_lengths=max_lengths, seed=seed, topk=topk, topp=topp,
                               temperature=temperature, alpha=0.6, shrink=shrink)
    return run


def sample(tables, max_lengths, seed=0, topk=0, topp=0.0, temperature=1.0, shrink=True):
    result = sampler(shrink)(tf.constant(tables), tf.constant(max_lengths, tf.int32),
                             tf.constant(seed, tf.int64), tf.constant(topk),
                             tf.constant(topp, tf.float32), tf.constant(temperature, tf.float32))
    return [r.numpy() for r in result]


def outputs(ids, lengths):
    return [list(ids[b, 0, :lengths[b, 0]]) for b in range(len(ids))]


MAX_LENGTHS = [8, 3, 8, 1, 6, 8, 8, 5]


def test_only_kept_tokens_are_drawn_and_scores_are_the_models():
    """PAD and BOS are the model's favourites here, yet never drawn; with top-k 2 every
    token is one of its prefix's 2 best allowed ones; scores are log P / lp."""
    tables = make_tables(1, len(MAX_LENGTHS), eos_bias=-0.5)
    tables[..., PAD_ID] = tables[..., BOS_ID] = 5.0
    for seed in range(3):
        ids, scores, lengths = sample(tables, MAX_LENGTHS, seed=seed, topk=2)
        for b, tokens in enumerate(outputs(ids, lengths)):
            assert 1 <= len(tokens) <= MAX_LENGTHS[b] and set(tokens) <= set(TOKENS)
            assert tokens[-1] == EOS_ID or len(tokens) == MAX_LENGTHS[b]
            assert not ids[b, 0, len(tokens):].any()
            for i, token in enumerate(tokens):
                allowed = next_log_probs(tables[b], [BOS_ID] + tokens[:i])[list(TOKENS)]
                best = {TOKENS[j] for j in np.argsort(-allowed)[:2]}
                assert token in best
            np.testing.assert_allclose(scores[b, 0], log_prob(tables[b], tokens)
                                       / penalty(len(tokens), 0.6), rtol=1e-5, atol=1e-5)


def test_a_seed_reproduces_its_outputs_and_another_seed_does_not():
    tables = make_tables(2, len(MAX_LENGTHS), eos_bias=-1.0, scale=0.5)
    first = sample(tables, MAX_LENGTHS, seed=11)
    again = sample(tables, MAX_LENGTHS, seed=11)
    other = sample(tables, MAX_LENGTHS, seed=12)
    for got, want in zip(again, first):
        np.testing.assert_array_equal(got, want)
    assert outputs(other[0], other[2]) != outputs(first[0], first[2])
    # A sentence's draws do not depend on which others are still decoded.
    for got, want in zip(sample(tables, MAX_LENGTHS, seed=11, shrink=False), first):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("settings", [{"topk": 1}, {"temperature": 1e-4}])
def test_the_greedy_limits_give_the_beam_of_one(settings):
    tables = make_tables(3, len(MAX_LENGTHS), eos_bias=-0.5)
    ids, scores, lengths = sample(tables, MAX_LENGTHS, seed=5, **settings)
    greedy = beam_search(scripted_fn, initial_cache(tf.constant(tables)), vocab_size=VOCAB,
                         beam_size=1, alpha=0.6, max_lengths=tf.constant(MAX_LENGTHS))
    np.testing.assert_array_equal(ids, greedy.ids.numpy())
    np.testing.assert_array_equal(lengths, greedy.lengths.numpy())
    np.testing.assert_allclose(scores, greedy.scores.numpy(), rtol=1e-6)
    assert len(set(lengths[:, 0])) > 2
