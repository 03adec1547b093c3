"""Sampling: one output per sentence drawn from the model (back-translation at scale).

Model-independent like beam_search.py: the model enters only through
`symbols_to_logits_fn(ids, step, cache) -> (logits, cache)`, the same decode
step and cache the beam search runs. Each step draws the next token of every
live sentence from the model's distribution reshaped by (in this order):
  temperature T: log-probs / T (T -> 0 approaches argmax, 1 leaves them);
  top-k: only the k most probable tokens stay (the lower id first among equals,
    as the beam's top-k), 0: off;
  top-p (nucleus): of what is left, renormalized, only the smallest set of the
    most probable tokens whose probabilities add up to at least p, 0 or 1: off.
PAD, BOS and `never_ids` are never drawn (as in the beam search). The draw is stateless
(`draw`: Gumbel-max over noise seeded by (seed, step)): the same seed and the same
batch give the same outputs, in any process.

An output's score is the model's own log-probability of it (the unfiltered,
untempered distribution) divided by the beam's length penalty: what the
Translator's scoring gives the same pair. The state is beam_search's with a beam
of 1 (state.py), so a sentence ends at EOS or at its maximum length and leaves
the working rows (live_rows.py) exactly as a beam-1 search's would.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from tf_transformer.config import BOS_ID, EOS_ID, PAD_ID
from tf_transformer.search import live_rows
from tf_transformer.search import prefix as prefix_lib
from tf_transformer.search.beam_search import BeamSearchResult
from tf_transformer.search.beam_step import length_penalty
from tf_transformer.search.state import (NEG_INF, BeamState, Cache, SymbolsToLogitsFn,
                                         empty_results)


class SamplingConfig(NamedTuple):
    """The loop's fixed arguments (see `sample`)."""

    symbols_to_logits_fn: SymbolsToLogitsFn
    vocab_size: int
    alpha: tf.Tensor
    topk: tf.Tensor  # int32 []
    topp: tf.Tensor  # float32 []
    temperature: tf.Tensor  # float32 []
    seed: tf.Tensor  # int64 []
    eos_id: int
    bos_id: int
    never_ids: tuple[int, ...] = ()  # never drawn, besides PAD and BOS
    prefix: Any = None  # search/prefix.py's TargetPrefix, or None
    row_buckets: bool = False  # shrink to search/shape_buckets.py's buckets


def filter_logits(log_probs: tf.Tensor, topk, topp, temperature) -> tf.Tensor:
    """log_probs float32 [rows, vocab] -> the logits a token is drawn from: divided
    by `temperature`, -inf outside the top `topk` (if > 0), then outside the
    nucleus of `topp` (if in (0, 1)); the module docstring's order."""
    logits = log_probs / tf.cast(temperature, tf.float32)
    topk = tf.minimum(tf.cast(topk, tf.int32), tf.shape(logits)[1])
    logits = tf.cond(topk > 0, lambda: _keep_top_k(logits, topk), lambda: logits)
    topp = tf.cast(topp, tf.float32)
    return tf.cond(tf.logical_and(topp > 0.0, topp < 1.0), lambda: _keep_nucleus(logits, topp),
                   lambda: logits)


def _scatter_rows(values: tf.Tensor, index: tf.Tensor, like: tf.Tensor) -> tf.Tensor:
    """A -inf tensor shaped like `like` [rows, vocab] with values [rows, n] at index [rows, n]."""
    rows = tf.broadcast_to(tf.range(tf.shape(index)[0])[:, tf.newaxis], tf.shape(index))
    return tf.tensor_scatter_nd_update(tf.fill(tf.shape(like), NEG_INF),
                                       tf.stack([rows, index], axis=-1), values)


def _keep_top_k(logits: tf.Tensor, k: tf.Tensor) -> tf.Tensor:
    values, index = tf.math.top_k(logits, k=k)
    return _scatter_rows(values, index, logits)


def _keep_nucleus(logits: tf.Tensor, p: tf.Tensor) -> tf.Tensor:
    """The smallest most-probable set with probability >= p (at least one token)."""
    values, index = tf.math.top_k(logits, k=tf.shape(logits)[1])  # sorted, best first
    before = tf.math.cumsum(tf.nn.softmax(values), axis=1, exclusive=True)
    keep = tf.logical_and(before < p, values > NEG_INF)
    keep = tf.logical_or(keep, tf.range(tf.shape(values)[1]) == 0)  # the best always
    return _scatter_rows(tf.where(keep, values, NEG_INF), index, logits)


def draw(log_probs: tf.Tensor, config: SamplingConfig, step, sentence: tf.Tensor,
         batch) -> tf.Tensor:
    """One token per row, int32 [rows], from filter_logits(log_probs): the Gumbel-max
    draw argmax(logits + G), G Gumbel noise from stateless uniforms [batch, vocab]
    seeded by (config.seed, step), row i taking the noise of its sentence
    `sentence[i]` (int32 [rows], in [0, batch)). So a sentence's draws depend on
    the seed, the step and its place in the batch, not on which other sentences
    are still being decoded."""
    logits = filter_logits(log_probs, config.topk, config.topp, config.temperature)
    seed = tf.stack([tf.cast(config.seed, tf.int64), tf.cast(step, tf.int64)])
    uniform = tf.random.stateless_uniform(tf.stack([batch, tf.shape(logits)[1]]), seed,
                                          minval=np.finfo(np.float32).tiny, maxval=1.0)
    gumbel = -tf.math.log(-tf.math.log(tf.gather(uniform, sentence)))
    return tf.argmax(logits + gumbel, axis=1, output_type=tf.int32)


def sample(symbols_to_logits_fn: SymbolsToLogitsFn, initial_cache: Cache, *, vocab_size: int,
           max_lengths: tf.Tensor, seed, topk=0, topp=0.0, temperature=1.0,
           alpha: float | tf.Tensor = 0.6, eos_id: int = EOS_ID, bos_id: int = BOS_ID,
           shrink: bool = True, never_ids: tuple[int, ...] = (),
           prefix: prefix_lib.TargetPrefix | None = None,
           row_buckets: bool = False) -> BeamSearchResult:
    """Draws one output per sentence (module docstring).

    Args:
      symbols_to_logits_fn, vocab_size, max_lengths, eos_id, bos_id: as for
        BeamSearch (beam_search.py); initial_cache holds one row per sentence.
      seed: int64 scalar of the stateless draws.
      topk, topp, temperature: scalars, see `filter_logits` (temperature > 0).
      alpha: the length penalty of the reported scores.
      shrink: finished sentences leave the working rows (the cache must then
        compact: live_rows.can_compact).
      never_ids: more token ids never drawn, as BeamSearch's.
      prefix: outputs forced to start with it (search/prefix.py), as BeamSearch's.
      row_buckets: with `shrink`, the working rows stay at search/shape_buckets.py's
        buckets (done sentences kept as padding), as BeamSearch's.
    Returns:
      BeamSearchResult with nbest 1: ids [batch, 1, max(max_lengths)] (EOS where
      drawn, PAD after), scores [batch, 1] (log P / lp(length)), lengths [batch, 1].
    """
    config = SamplingConfig(symbols_to_logits_fn, vocab_size, tf.cast(alpha, tf.float32), topk,
                            topp, temperature, seed, eos_id, bos_id,
                            tuple(int(i) for i in never_ids), prefix, row_buckets)
    max_lengths = prefix_lib.raise_max_lengths(prefix, tf.maximum(tf.cast(max_lengths, tf.int32), 1))
    batch = tf.shape(max_lengths)[0]
    width = tf.maximum(tf.reduce_max(max_lengths), 1) + 1  # an empty batch too
    row = tf.where(tf.range(width) == 0, bos_id, PAD_ID)
    ids = tf.broadcast_to(row, tf.stack([batch, 1, width]))
    state = BeamState(
        step=tf.constant(0, tf.int32), alive_ids=ids, alive_log_probs=tf.zeros([batch, 1]),
        # A new tensor for the cache's in-place writes, as the beam search tiles it.
        alive_cache=live_rows.tile(initial_cache, 1),
        finished_ids=tf.fill(tf.shape(ids), PAD_ID),
        finished_scores=tf.fill(tf.stack([batch, 1]), NEG_INF),
        finished_lengths=tf.zeros(tf.stack([batch, 1]), tf.int32),
        done=tf.zeros(tf.stack([batch]), tf.bool), max_lengths=max_lengths,
        sentence=tf.range(batch), results=empty_results(batch, 1, width))
    shrink = shrink and live_rows.can_compact(initial_cache)

    def cond(state: BeamState) -> tf.Tensor:
        return tf.reduce_any(tf.logical_not(state.done))

    def body(state: BeamState) -> tuple[BeamState]:
        return (sampling_step(config, state, shrink),)

    invariants = tf.nest.map_structure(
        lambda t: tf.TensorShape([None] * t.shape.rank) if t.shape.rank else t.shape, state)
    (state,) = tf.while_loop(cond, body, (state,), shape_invariants=(invariants,))
    results = live_rows.write_results(state)
    return BeamSearchResult(ids=results.ids[:, :, 1:], scores=results.scores,
                            lengths=results.lengths)


def sampling_step(config: SamplingConfig, state: BeamState, shrink: bool) -> BeamState:
    """Every live sentence's next token drawn; those that end (EOS or their maximum
    length) are finished, and with `shrink` leave the working rows."""
    width = tf.shape(state.alive_ids)[2]
    logits, cache = config.symbols_to_logits_fn(state.alive_ids[:, 0], state.step,
                                                state.alive_cache)
    log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32))
    vocab = tf.range(config.vocab_size)
    never = tf.logical_or(vocab == PAD_ID, vocab == config.bos_id)
    for token in config.never_ids:  # <unk> under a byte-fallback vocabulary
        never = tf.logical_or(never, vocab == token)
    log_probs = prefix_lib.force(config.prefix, tf.where(never, NEG_INF, log_probs), log_probs,
                                 state.sentence, state.step)
    tokens = draw(log_probs, config, state.step, state.sentence,
                  tf.shape(state.results.scores)[0])
    log_prob = state.alive_log_probs[:, 0] + tf.gather(log_probs, tokens, batch_dims=1)
    ids = tf.where(tf.range(width) == state.step + 1, tokens[:, tf.newaxis, tf.newaxis],
                   state.alive_ids)
    step = state.step + 1
    ends = tf.logical_or(tokens == config.eos_id, step >= state.max_lengths)
    finish = tf.logical_and(ends, tf.logical_not(state.done))
    score = log_prob / length_penalty(step, config.alpha)
    done = tf.logical_or(state.done, ends)
    state = state._replace(
        step=step, alive_ids=ids, alive_cache=cache,
        alive_log_probs=tf.where(done, NEG_INF, log_prob)[:, tf.newaxis],
        finished_ids=tf.where(finish[:, tf.newaxis, tf.newaxis], ids, state.finished_ids),
        finished_scores=tf.where(finish[:, tf.newaxis], score[:, tf.newaxis],
                                 state.finished_scores),
        finished_lengths=tf.where(finish[:, tf.newaxis], step, state.finished_lengths),
        done=done)
    if not shrink:
        return state
    return live_rows.drop_done(state, tf.range(tf.shape(done)[0]), beam=1,
                               bucketed=config.row_buckets)
