"""A scripted model for the alignment and sampling tests (tests/search/).

Logits come from a per-sentence random table indexed by (step, previous token,
prefix sum mod 3); the prefix sum lives in the cache, so a cache row left with
the wrong parent, or a sentence's row gathered from another sentence, changes
the results. `aligned_fn` also returns a scripted "attention" row per step,
[step, input token, prefix sum, sentence], which a hypothesis's output ids
determine: the search's alignments can be checked against them exactly.
"""

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tf_transformer.config import BOS_ID, EOS_ID, PAD_ID

VOCAB = 6  # PAD 0, UNK 1, BOS 2, EOS 3, and 4, 5
MOD = 3
STEPS = 8  # the tables cover max lengths up to 8
TOKENS = (1, EOS_ID, 4, 5)  # all but PAD and BOS
ATTENTION_WIDTH = 4  # the scripted attention's "source length"


def make_tables(seed, batch, eos_bias=0.0, scale=2.0):
    """[batch, STEPS, VOCAB, MOD, VOCAB] logits; PAD and BOS very unlikely."""
    table = np.random.default_rng(seed).normal(size=(batch, STEPS, VOCAB, MOD, VOCAB)) * scale
    table[..., EOS_ID] += eos_bias
    table[..., PAD_ID] = -1e9
    table[..., BOS_ID] = -1e9
    return table.astype(np.float32)


class TableCache(NamedTuple):
    """A scripted model's cache (beam_search.BeamCache): its tables, which a sentence's
    beams share, and each hypothesis's prefix sum, which follows its parent."""

    memory: tf.Tensor  # [batch, STEPS, ...]: the tables, e.g. make_tables'
    sum: tf.Tensor  # int32 [rows]

    def tile(self, beam):
        return self._make(tf.repeat(t, beam, axis=0) for t in self)

    def reorder(self, rows):
        return self._replace(sum=tf.gather(self.sum, rows))

    def compact(self, rows):  # finished sentences leave the batch (live_rows.py)
        return self._make(tf.gather(t, rows) for t in self)


class SentenceCache(NamedTuple):
    """A TableCache that also holds each sentence's number (the scripted attention's)."""

    memory: tf.Tensor  # [batch, STEPS, VOCAB, MOD, VOCAB]
    sentence: tf.Tensor  # float32 [batch]
    sum: tf.Tensor  # int32 [rows]

    tile = TableCache.tile
    reorder = TableCache.reorder
    compact = TableCache.compact


def initial_cache(tables) -> SentenceCache:
    batch = tf.shape(tables)[0]
    return SentenceCache(tables, tf.cast(tf.range(batch), tf.float32),
                         tf.zeros([batch], tf.int32))


def _step(ids, step, cache):
    prefix_sum = cache.sum + ids[:, step]
    rows = tf.range(tf.shape(ids)[0])
    index = tf.stack([rows, tf.fill(tf.shape(rows), step), ids[:, step], prefix_sum % MOD], 1)
    return tf.gather_nd(cache.memory, index), cache._replace(sum=prefix_sum), prefix_sum


def scripted_fn(ids, step, cache):
    """(ids [rows, width], step, SentenceCache) -> (logits [rows, VOCAB], cache)."""
    logits, cache, _ = _step(ids, step, cache)
    return logits, cache


def aligned_fn(ids, step, cache):
    """scripted_fn and the step's scripted attention [rows, ATTENTION_WIDTH]."""
    logits, cache, prefix_sum = _step(ids, step, cache)
    rows = tf.shape(ids)[0]
    attention = tf.stack([tf.cast(tf.fill([rows], step), tf.float32),
                          tf.cast(ids[:, step], tf.float32), tf.cast(prefix_sum, tf.float32),
                          tf.repeat(cache.sentence, rows // tf.shape(cache.sentence)[0])], 1)
    return logits, cache, attention


def expected_attention(tokens, sentence):
    """The scripted attention rows of an output `tokens` [n]: [n, ATTENTION_WIDTH]."""
    inputs = [BOS_ID] + list(tokens[:-1])
    return np.array([[t, inputs[t], sum(inputs[:t + 1]), sentence] for t in range(len(tokens))],
                    np.float32)


def log_softmax(x):
    x = x.astype(np.float64)
    x = x - x.max()
    return x - np.log(np.exp(x).sum())


def next_log_probs(table, prefix):
    """prefix starts with BOS; the model's log-probs for the next token."""
    step = len(prefix) - 1
    return log_softmax(table[step, prefix[-1], sum(prefix) % MOD])


def log_prob(table, tokens):
    """log P(tokens) under the scripted model, float64."""
    return sum(next_log_probs(table, [BOS_ID] + list(tokens[:i]))[t]
               for i, t in enumerate(tokens))


def penalty(length, alpha):
    return ((5.0 + length) / 6.0) ** alpha
