"""Beam search against scripted models: exhaustive optimum, greedy, early stop, XLA.

The scripted "language model" draws logits from a per-sentence random table
indexed by (step, previous token, sum of the prefix mod 3). The sum lives in the
cache, so a cache row left with the wrong parent changes the results; the table
lives in the cache too, like encoder memory. The cache is a `TableCache`, which
tiles and reorders itself (beam_search.BeamCache) and leaves the table alone
(but when finished sentences leave the batch), or a plain dict, which the search reorders whole.
"""

import functools

import numpy as np
import pytest
import tensorflow as tf
from search_fixtures import (MOD, STEPS, TOKENS, VOCAB, TableCache, log_prob, make_tables,
                             next_log_probs, penalty)

from tf_transformer.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from tf_transformer.search.beam_search import (
    BeamCache,
    BeamSearchResult,
    beam_search,
    length_penalty,
)

TABLE_SPEC = tf.TensorSpec([None, STEPS, VOCAB, MOD, VOCAB], tf.float32)
CALLS = tf.Variable(0, dtype=tf.int64, trainable=False)


def _logits(table, step, prev, prefix_sum):
    rows = tf.range(tf.shape(prev)[0])
    index = tf.stack([rows, tf.fill(tf.shape(rows), step), prev, prefix_sum % MOD], axis=1)
    return tf.gather_nd(table, index)


class StuckCache(TableCache):
    """A cache whose reorder forgets to move the sums: wrong results expected."""

    def reorder(self, rows):
        return self


def cached_fn(ids, step, cache):
    """Reads only ids[:, step]; the prefix sum comes from the cache."""
    CALLS.assign_add(1)
    prefix_sum = cache.sum + ids[:, step]
    return _logits(cache.memory, step, ids[:, step], prefix_sum), cache._replace(sum=prefix_sum)


def dict_fn(ids, step, cache):
    """cached_fn over a plain dict cache."""
    logits, cache = cached_fn(ids, step, TableCache(**cache))
    return logits, cache._asdict()


def uncached_fn(ids, step, cache):
    """Sums the whole buffer: relies on BOS, the tokens so far, then only PAD (0)."""
    prefix_sum = tf.reduce_sum(ids, axis=1)
    return _logits(cache.memory, step, ids[:, step], prefix_sum), cache


CACHES = {"object": TableCache, "stuck": StuckCache,
          "dict": lambda memory, sum: {"memory": memory, "sum": sum}}


def search(fn, tables, max_lengths, alpha, beam, nbest, max_decode_length=None, cache="object"):
    batch = tf.shape(tables)[0]
    initial = CACHES[cache](memory=tables, sum=tf.zeros([batch], tf.int32))
    return beam_search(fn, initial, vocab_size=VOCAB, beam_size=beam, alpha=alpha,
                       max_lengths=max_lengths, nbest=nbest, max_decode_length=max_decode_length)


@functools.lru_cache(maxsize=None)
def decoder(beam, nbest, cached=True, jit=False, cache="object"):
    """A tf.function over any batch size: (tables, max_lengths, alpha) -> result."""
    fn = (dict_fn if cache == "dict" else cached_fn) if cached else uncached_fn
    max_decode_length = STEPS if jit else None

    @tf.function(autograph=False, jit_compile=jit, input_signature=[
        TABLE_SPEC, tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.float32)])
    def decode(tables, max_lengths, alpha):
        return search(fn, tables, max_lengths, alpha, beam, nbest, max_decode_length, cache)

    return decode


def decode(tables, max_lengths, alpha, beam, nbest, **kwargs):
    result = decoder(beam, nbest, **kwargs)(
        tf.constant(tables), tf.constant(max_lengths, tf.int32), tf.constant(alpha, tf.float32))
    return BeamSearchResult(*(r.numpy() for r in result))


# -- numpy reference -------------------------------------------------------------

def exhaustive(table, max_length, alpha):
    """Every output (ended by EOS, or forced at max_length), best first: [(score, tokens)]."""
    outputs = []

    def expand(prefix, log_prob):
        log_probs = next_log_probs(table, prefix)
        for token in TOKENS:
            lp = log_prob + log_probs[token]
            tokens = prefix[1:] + [token]
            if token == EOS_ID or len(tokens) == max_length:
                outputs.append((lp / penalty(len(tokens), alpha), tokens))
            else:
                expand(prefix + [token], lp)

    expand([BOS_ID], 0.0)
    return sorted(outputs, key=lambda o: -o[0])


def greedy(table, max_length, alpha):
    """Argmax decoding by hand: (score, tokens)."""
    prefix, log_prob = [BOS_ID], 0.0
    while True:
        log_probs = next_log_probs(table, prefix)
        token = int(np.argmax(log_probs))
        log_prob += log_probs[token]
        prefix.append(token)
        if token == EOS_ID or len(prefix) - 1 == max_length:
            return log_prob / penalty(len(prefix) - 1, alpha), prefix[1:]


def reference_score(table, tokens, alpha):
    return log_prob(table, tokens) / penalty(len(tokens), alpha)


def outputs(result, b):
    """The n-best token lists of sentence b."""
    return [list(result.ids[b, n, :result.lengths[b, n]]) for n in range(result.ids.shape[1])]


# -- tests -------------------------------------------------------------------------

def test_length_penalty_is_gnmt():
    np.testing.assert_allclose(length_penalty([1, 6, 11], 0.6).numpy(),
                               [1.0, (11 / 6) ** 0.6, (16 / 6) ** 0.6], rtol=1e-6)
    np.testing.assert_allclose(length_penalty(7, 0.0).numpy(), 1.0)


# With 4 tokens and max length 5, at most 4 * 27 extensions exist at a step, so
# a beam of 128 prunes nothing: the search is exhaustive.
@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.5])
@pytest.mark.parametrize("seed", [0, 1])
def test_large_beam_returns_exhaustive_nbest(alpha, seed):
    max_lengths = [5, 3, 4]
    tables = make_tables(seed, 3)
    result = decode(tables, max_lengths, alpha, beam=128, nbest=3)
    for b, max_length in enumerate(max_lengths):
        expected = exhaustive(tables[b], max_length, alpha)[:3]
        assert outputs(result, b) == [tokens for _, tokens in expected]
        np.testing.assert_allclose(result.scores[b], [s for s, _ in expected], rtol=1e-5, atol=1e-5)


def test_batch_equals_each_sentence_alone():
    tables = make_tables(2, 4)
    max_lengths = [3, 7, 5, 1]
    batch = decode(tables, max_lengths, 0.6, beam=4, nbest=2)
    for b, max_length in enumerate(max_lengths):
        alone = decode(tables[b:b + 1], [max_length], 0.6, beam=4, nbest=2)
        width = alone.ids.shape[2]
        np.testing.assert_array_equal(batch.ids[b, :, :width], alone.ids[0])
        assert not batch.ids[b, :, width:].any()
        np.testing.assert_array_equal(batch.lengths[b], alone.lengths[0])
        np.testing.assert_allclose(batch.scores[b], alone.scores[0], rtol=1e-6)


def test_one_trace_for_any_batch_size():
    decode(make_tables(3, 1), [4], 0.6, beam=4, nbest=2)
    decode(make_tables(4, 5), [2, 6, 3, 8, 1], 0.6, beam=4, nbest=2)
    assert decoder(4, 2).experimental_get_tracing_count() == 1


def test_outputs_are_well_formed():
    max_lengths = [1, 2, 4, 6, 8, 8]
    tables = make_tables(5, len(max_lengths), eos_bias=-1.0)
    result = decode(tables, max_lengths, 0.6, beam=4, nbest=4)
    assert result.ids.shape == (6, 4, 8)
    for b, max_length in enumerate(max_lengths):
        assert np.all(np.diff(result.scores[b]) <= 0), "scores sorted, best first"
        assert np.all(np.isfinite(result.scores[b])), "nbest outputs, all real"
        kept = outputs(result, b)
        if max_length > 1:
            assert len({tuple(t) for t in kept}) == 4, "distinct hypotheses"
        for n, tokens in enumerate(kept):
            assert 1 <= len(tokens) <= max_length
            assert not result.ids[b, n, len(tokens):].any(), "PAD after the output"
            assert all(t in TOKENS for t in tokens)
            assert EOS_ID not in tokens[:-1]
            assert tokens[-1] == EOS_ID or len(tokens) == max_length
            np.testing.assert_allclose(result.scores[b, n],
                                       reference_score(tables[b], tokens, 0.6), rtol=1e-5, atol=1e-5)


def test_pad_and_bos_never_generated():
    tables = make_tables(6, 2)
    tables[..., PAD_ID] = 10.0  # the model prefers them; the search must not
    tables[..., BOS_ID] = 10.0
    result = decode(tables, [4, 6], 0.6, beam=4, nbest=2)
    for b in range(2):
        for tokens in outputs(result, b):
            assert tokens and PAD_ID not in tokens and BOS_ID not in tokens


def test_larger_alpha_gives_longer_outputs():
    """Exactly solved, the argmax length cannot shrink as alpha grows."""
    tables = make_tables(7, 12, eos_bias=1.0)
    max_lengths = [5] * 12
    alphas = [0.0, 0.5, 1.0, 2.0]
    exact = np.stack([decode(tables, max_lengths, a, beam=128, nbest=3).lengths[:, 0]
                      for a in alphas])
    assert np.all(np.diff(exact, axis=0) >= 0)
    beam4 = np.stack([decode(tables, max_lengths, a, beam=4, nbest=2).lengths[:, 0]
                      for a in alphas])
    means = beam4.mean(axis=1)
    assert np.all(np.diff(means) >= 0) and means[-1] > means[0], means


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_one_is_greedy(alpha):
    max_lengths = [1, 3, 5, 8, 8, 8]
    tables = make_tables(8, len(max_lengths), eos_bias=0.5)
    result = decode(tables, max_lengths, alpha, beam=1, nbest=1)
    for b, max_length in enumerate(max_lengths):
        score, tokens = greedy(tables[b], max_length, alpha)
        assert outputs(result, b) == [tokens]
        np.testing.assert_allclose(result.scores[b, 0], score, rtol=1e-5, atol=1e-5)


def test_early_stop_is_real_and_exact():
    """EOS is very likely: the bound stops the loop long before max length 8."""
    tables = make_tables(9, 3, eos_bias=4.0)
    CALLS.assign(0)
    result = decode(tables, [8, 8, 8], 0.6, beam=4, nbest=2)
    assert 1 <= CALLS.numpy() <= 4  # of 8 allowed
    for b in range(3):
        expected = exhaustive(tables[b], 8, 0.6)[:2]
        assert outputs(result, b) == [tokens for _, tokens in expected]
        np.testing.assert_allclose(result.scores[b], [s for s, _ in expected], rtol=1e-5, atol=1e-5)


def test_runs_to_max_length_without_eos():
    tables = make_tables(10, 2, eos_bias=-1e9)
    CALLS.assign(0)
    result = decode(tables, [3, 6], 0.6, beam=4, nbest=2)
    assert CALLS.numpy() == 6
    np.testing.assert_array_equal(result.lengths, [[3, 3], [6, 6]])


def test_cached_equals_uncached():
    tables = make_tables(11, 3)
    cached = decode(tables, [6, 2, 8], 0.6, beam=4, nbest=2)
    uncached = decode(tables, [6, 2, 8], 0.6, beam=4, nbest=2, cached=False)
    for got, want in zip(uncached, cached):
        np.testing.assert_array_equal(got, want)


def test_cache_object_reorders_itself_and_a_plain_nest_is_reordered_whole():
    assert isinstance(TableCache(tf.zeros([1]), tf.zeros([1])), BeamCache)
    assert not isinstance({"memory": 1}, BeamCache)
    tables = make_tables(12, 3)
    reference = decode(tables, [6, 2, 8], 0.6, beam=4, nbest=2)
    whole = decode(tables, [6, 2, 8], 0.6, beam=4, nbest=2, cache="dict")
    for got, want in zip(whole, reference):
        np.testing.assert_array_equal(got, want)
    # The search calls the object's reorder: one that moves nothing changes the outputs.
    stuck = decode(tables, [6, 2, 8], 0.6, beam=4, nbest=2, cache="stuck")
    assert not np.array_equal(stuck.ids, reference.ids)


def test_xla_matches_graph():
    tables = make_tables(12, 3)
    graph = decode(tables, [5, 3, 7], 0.6, beam=4, nbest=2)
    xla = decode(tables, [5, 3, 7], 0.6, beam=4, nbest=2, jit=True)
    assert xla.ids.shape == (3, 2, STEPS)  # the static max_decode_length
    np.testing.assert_array_equal(xla.ids[:, :, :7], graph.ids)
    assert not xla.ids[:, :, 7:].any()
    np.testing.assert_array_equal(xla.lengths, graph.lengths)
    np.testing.assert_allclose(xla.scores, graph.scores, rtol=1e-5, atol=1e-5)


def test_rejects_bad_arguments():
    cache = {"memory": tf.zeros([1, 2])}
    kwargs = dict(vocab_size=VOCAB, alpha=0.6, max_lengths=tf.constant([3]))
    with pytest.raises(ValueError, match="nbest"):
        beam_search(cached_fn, cache, beam_size=2, nbest=3, **kwargs)
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(cached_fn, cache, beam_size=0, **kwargs)
    with pytest.raises(ValueError, match="special ids"):
        beam_search(cached_fn, cache, beam_size=2, **{**kwargs, "vocab_size": 3})


def test_never_ids_are_never_generated():
    """The Translator's <unk> under a byte-fallback vocabulary: forbidden as PAD and BOS are,
    the other hypotheses searched and scored as before (log-probs not renormalized)."""
    tables = make_tables(13, 2)
    tables[..., UNK_ID] += 3.0  # the model prefers <unk>

    @functools.lru_cache(maxsize=None)
    def decoder(beam, never_ids):
        @tf.function(autograph=False, input_signature=[TABLE_SPEC])
        def decode(tables):
            initial = TableCache(memory=tables, sum=tf.zeros([tf.shape(tables)[0]], tf.int32))
            return beam_search(cached_fn, initial, vocab_size=VOCAB, beam_size=beam, alpha=0.6,
                               max_lengths=tf.constant([4, 4]), nbest=2, never_ids=never_ids)
        return lambda: BeamSearchResult(*(r.numpy() for r in decode(tf.constant(tables))))

    # Without never_ids: the module's beam 4, nbest 2 search (traced by the tests above).
    allowed = decode(tables, [4, 4], 0.6, beam=4, nbest=2)
    assert any(UNK_ID in tokens for b in range(2) for tokens in outputs(allowed, b))
    beam4, exact = decoder(4, (UNK_ID,))(), decoder(128, (UNK_ID,))()
    for b in range(2):
        assert all(UNK_ID not in tokens for tokens in outputs(beam4, b))
        np.testing.assert_allclose(beam4.scores[b], [reference_score(tables[b], tokens, 0.6)
                                                     for tokens in outputs(beam4, b)], rtol=1e-5)
        expected = [o for o in exhaustive(tables[b], 4, 0.6) if UNK_ID not in o[1]][:2]
        assert outputs(exact, b) == [tokens for _, tokens in expected]
        np.testing.assert_allclose(exact.scores[b], [s for s, _ in expected], rtol=1e-5)
