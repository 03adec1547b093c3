"""Scoring given pairs: log P(y | x) under the model, teacher-forced (rescoring, corpus
filtering, quality estimation).

One full decoder pass over [BOS] + y predicts y + [EOS]; the log-probability of
a pair is the sum of the log-softmax of the logits at each target token, EOS
included: exactly what the beam search adds up when it generates y (it sets
PAD and BOS to -inf without renormalizing, so the generated tokens' log-probs
are the log-softmax's). Hence the score of the beam's own output, divided by the
same length penalty, is the score the beam reported (tests/decoding/test_scoring.py).

The output layer runs on the target's tokens only (the trainer's way), so a batch
costs [tokens, vocab] of logits, not [batch, T, vocab].
"""

from __future__ import annotations

import tensorflow as tf

from tf_transformer.config import BOS_ID, EOS_ID, PAD_ID
from tf_transformer.model.transformer import Transformer
from tf_transformer.search.beam_step import length_penalty


def target_length(target_ids: tf.Tensor) -> tf.Tensor:
    """int32 [...]: the tokens of target_ids [..., T] before the first EOS or PAD."""
    ended = tf.logical_or(target_ids == EOS_ID, target_ids == PAD_ID)
    return tf.reduce_sum(tf.cast(tf.math.cumsum(tf.cast(ended, tf.int32), axis=-1) == 0,
                                 tf.int32), axis=-1)


def teacher_forced(target_ids: tf.Tensor, max_tokens: int) -> tuple[tf.Tensor, tf.Tensor]:
    """target_ids int32 [B, T] (tokens, then EOS or PAD) -> (target_in, target_out), int32
    [B, T' + 1]: [BOS] + y and y + [EOS], PAD after, y cut to `max_tokens` - 1 tokens."""
    target_ids = tf.convert_to_tensor(target_ids, tf.int32)[:, :max_tokens - 1]
    lengths = target_length(target_ids)  # [B]
    width = tf.shape(target_ids)[1]
    position = tf.range(width + 1)[tf.newaxis]  # [1, T' + 1]
    tokens = tf.where(position[:, :-1] < lengths[:, tf.newaxis], target_ids, PAD_ID)
    batch = tf.shape(target_ids)[0]
    target_in = tf.concat([tf.fill(tf.stack([batch, 1]), BOS_ID), tokens], axis=1)
    target_out = tf.concat([tokens, tf.fill(tf.stack([batch, 1]), PAD_ID)], axis=1)
    target_out = tf.where(position == lengths[:, tf.newaxis], EOS_ID, target_out)
    return target_in, target_out


def score_pairs(model: Transformer, source_ids: tf.Tensor, target_ids: tf.Tensor, alpha,
                max_target_length: int) -> dict:
    """source_ids int32 [B, S] (tokens, EOS, PAD after), target_ids int32 [B, T] (tokens,
    then EOS or PAD; EOS is appended, at most max_target_length tokens with it) ->
    {"log_prob": float32 [B] (log P(y + EOS | x)), "tokens": int32 [B] (|y| + 1),
     "log_prob_per_token": float32 [B], "score": float32 [B] (log_prob / lp(tokens)),
     with lp the beam search's GNMT length penalty at `alpha`}."""
    source_ids = tf.convert_to_tensor(source_ids, tf.int32)
    target_in, target_out = teacher_forced(target_ids, max_target_length)
    memory = model.encode(source_ids, training=False)
    states = model.decode_states(target_in, memory, source_ids, training=False)
    scored = target_out != PAD_ID  # y and EOS: [B, T' + 1]
    logits = model.logits(tf.boolean_mask(states, scored))  # [tokens, vocab], float32
    log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32))
    token_log_probs = tf.gather(log_probs, tf.boolean_mask(target_out, scored), batch_dims=1)
    rows = tf.boolean_mask(tf.broadcast_to(tf.range(tf.shape(target_out)[0])[:, tf.newaxis],
                                           tf.shape(target_out)), scored)
    log_prob = tf.math.unsorted_segment_sum(token_log_probs, rows, tf.shape(target_out)[0])
    tokens = tf.reduce_sum(tf.cast(scored, tf.int32), axis=1)
    return {"log_prob": log_prob, "tokens": tokens,
            "log_prob_per_token": log_prob / tf.cast(tokens, tf.float32),
            "score": log_prob / length_penalty(tokens, alpha)}
