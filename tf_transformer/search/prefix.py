"""Target prefixes: outputs forced to start with given tokens, then searched freely.

Interactive translation (a translator types the start of a sentence, the search
completes it) and forced target-language tags need the search to continue a
prefix. A `TargetPrefix` holds each sentence's prefix tokens; at step t (the
output's token t, from 0) a sentence whose prefix has more than t tokens may only
extend its hypotheses by prefix token t: every other token's log-probability is
-inf, that token's is the model's own (even for a token the search never
generates freely, such as <unk>), so the prefix's log-probabilities count in the
score as `score` counts them. After the prefix the search is the free one. With a
beam of k, the prefix steps keep one live hypothesis (the others stay dead), as
the first step does; an empty prefix changes nothing. The semantics are
CTranslate2's `target_prefix`.

A sentence's maximum output length is raised to its prefix length + 1, so the
prefix always fits with EOS.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from tf_transformer.config import PAD_ID
from tf_transformer.search.state import NEG_INF


class TargetPrefix(NamedTuple):
    """ids int32 [batch, P + 1]: each sentence's prefix tokens (no BOS, no EOS), PAD
    after, at least one PAD column; lengths int32 [batch]: its token count (0: none)."""

    ids: tf.Tensor
    lengths: tf.Tensor


def from_ids(ids: tf.Tensor) -> TargetPrefix:
    """A TargetPrefix of int32 [batch, P] prefix tokens, PAD after each (P may be 0)."""
    ids = tf.convert_to_tensor(ids, tf.int32)
    lengths = tf.reduce_sum(tf.cast(ids != PAD_ID, tf.int32), axis=1)
    return TargetPrefix(tf.pad(ids, [[0, 0], [0, 1]], constant_values=PAD_ID), lengths)


def raise_max_lengths(prefix: TargetPrefix | None, max_lengths: tf.Tensor) -> tf.Tensor:
    """max_lengths int32 [batch], at least each prefix's length + 1 (the module docstring)."""
    if prefix is None:
        return max_lengths
    return tf.maximum(max_lengths, prefix.lengths + 1)


def force(prefix: TargetPrefix | None, log_probs: tf.Tensor, model_log_probs: tf.Tensor,
          sentence: tf.Tensor, step: tf.Tensor) -> tf.Tensor:
    """log_probs float32 [rows, ..., vocab] with the rows whose sentence (`sentence` int32
    [rows], the row's index in the caller's batch) is still inside its prefix at `step`
    forced: -inf but at the prefix's token, which takes `model_log_probs`' value there
    (the same shape: the model's, before any token was masked)."""
    if prefix is None:
        return log_probs
    last = tf.shape(prefix.ids)[1] - 1
    tokens = tf.gather(prefix.ids[:, tf.minimum(step, last)], sentence)  # [rows]
    forced = step < tf.gather(prefix.lengths, sentence)  # [rows]
    rank = len(log_probs.shape)
    expand = [-1] + [1] * (rank - 1)
    is_token = tf.range(tf.shape(log_probs)[-1]) == tf.reshape(tokens, expand)
    only_token = tf.where(is_token, model_log_probs, NEG_INF)
    return tf.where(tf.reshape(forced, expand), only_token, log_probs)
