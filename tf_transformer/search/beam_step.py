"""One step of beam search over its state (beam_search.py runs the loop).

A step (`search_step`) has three named parts:
  1. grow alive: extend every alive hypothesis by every token and keep the k
     extensions with the highest log-probability, EOS extensions included.
  2. new alive: those extensions that neither end with EOS nor reach their
     sentence's maximum length (the others get log-prob -inf: dead slots).
  3. new finished: the other extensions (ended by EOS, or forced at the maximum
     length) merged with the finished hypotheses so far; the k best by score
     stay.
EOS extensions compete with continuations for the k slots, so a beam of 1 is
exactly greedy decoding. (tensor2tensor refills the alive beam from the top 2k
instead: a wider search, but a beam of 1 then differs from greedy.) There is no separate greedy loop: one written with argmax and no
finished set was no faster than beam_size=1 here (same time within noise on
CPU, 3+3 layers, d_model 256, vocab 8k and 32k).

Length penalty (Wu et al. 2016): lp(|Y|) = ((5 + |Y|) / 6) ** alpha, where |Y|
counts the generated tokens including EOS and excluding BOS; a hypothesis forced
at its maximum length m has |Y| = m. A score is log P(Y) / lp(|Y|).

Stopping rule. Take an alive hypothesis with log-prob a <= 0 after t tokens, in a
sentence with maximum length m. Anything grown from it has log-prob a' <= a
(every step adds a log-prob <= 0) and length n in [t + 1, m]. lp is monotone in
n, so lp(n) <= P = max(lp(t + 1), lp(m)) (= lp(m) for alpha >= 0). Hence
  a' / lp(n) <= a' / P <= a / P,
the first step because a' <= 0 and 0 < lp(n) <= P, the second because a' <= a.
So bound = (best alive log-prob) / P caps every hypothesis still to come. A
sentence is done once bound <= its nbest-th best finished score (-inf while
fewer than nbest have finished): nothing later can enter its n-best list with a
higher score, so stopping early returns what running to m would (up to ties). A sentence is
also done at step m, where every alive hypothesis has been forced to finish.
The loop ends when every sentence is done or at max(max_lengths) steps.
"""

from __future__ import annotations

import tensorflow as tf

from tf_transformer.config import PAD_ID
from tf_transformer.search import alignment, live_rows
from tf_transformer.search import prefix as prefix_lib
from tf_transformer.search.state import NEG_INF, BeamState, SearchConfig
from tf_transformer.search.top_k import chunked_top_k



def length_penalty(length, alpha) -> tf.Tensor:
    """GNMT length penalty ((5 + |Y|) / 6) ** alpha, float32, shaped like `length`."""
    length = tf.cast(length, tf.float32)
    return tf.pow((5.0 + length) / 6.0, tf.cast(alpha, tf.float32))


def search_step(config: SearchConfig, state: BeamState, shrink: bool,
                 first: bool = False) -> BeamState:
    """One step: grow alive, new alive, new finished, the stopping rule, then the
    cache rows follow their parents (and, with `shrink`, done sentences leave).

    `first`: the cache holds one row per sentence (only slot 0 is alive), the
    model runs on those rows and the cache is tiled to the beam afterwards; every
    copy is its parent's, so no reorder is needed but for done sentences leaving.
    With `config.alignment_width`, each hypothesis's attention history follows its
    ids (search/alignment.py).
    """
    aligned = config.alignment_width is not None
    if aligned:
        log_probs, ids, parents, tokens, cache, history = alignment.grow_alive(
            _grow_alive, config, state, first)
    else:
        log_probs, ids, parents, tokens, cache = _grow_alive(config, state, first)
    # Extensions that end here: by EOS, or forced at the sentence's max length.
    ends = tf.logical_or(tokens == config.eos_id,
                         (state.step + 1 >= state.max_lengths)[:, tf.newaxis])
    # new alive: the extensions that go on (-inf where one ended or the sentence is done).
    alive_log_probs = tf.where(tf.logical_or(ends, state.done[:, tf.newaxis]), NEG_INF, log_probs)
    finished_ids, finished_scores, finished_lengths, index = _new_finished(
        config, state, log_probs, ids, ends)
    if aligned:
        state = state._replace(alive_attention=history,
                               finished_attention=alignment.merge_finished(
                                   state.finished_attention, history, index, state.done))
    step = state.step + 1
    done = _update_done(config, step, alive_log_probs, finished_scores, state)
    # A done sentence keeps no alive hypotheses, so it cannot touch its results.
    alive_log_probs = tf.where(done[:, tf.newaxis], NEG_INF, alive_log_probs)
    state = state._replace(step=step, alive_ids=ids, alive_log_probs=alive_log_probs,
                           alive_cache=cache, finished_ids=finished_ids,
                           finished_scores=finished_scores,
                           finished_lengths=finished_lengths, done=done)
    beam = config.beam_size
    rows = tf.reshape(parents + tf.range(tf.shape(parents)[0])[:, tf.newaxis] * beam, [-1])
    if first:
        state = state._replace(alive_cache=live_rows.tile(cache, beam))
        return (live_rows.drop_done(state, rows, beam, reorder_rows=False,
                                    bucketed=config.row_buckets) if shrink else state)
    if shrink:
        return live_rows.drop_done(state, rows, beam, bucketed=config.row_buckets)
    if beam == 1:  # the parent of slot 0 is always slot 0
        return state
    return state._replace(alive_cache=live_rows.reorder(cache, rows))


def _grow_alive(config: SearchConfig, state: BeamState, first: bool = False):
    """The k most probable one-token extensions of the alive hypotheses (`first`:
    of slot 0's only, the model run on one row per sentence; the other slots'
    candidates are -inf, as their log-probs).

    Returns:
      log_probs float32 [batch, beam]: of the whole extended hypothesis.
      ids int32 [batch, beam, width]: the parent's ids plus the new token.
      parents, tokens int32 [batch, beam]: parent slot and new token.
      cache: the model's updated cache, rows still in parent order.
    """
    beam, vocab = config.beam_size, config.vocab_size
    width = tf.shape(state.alive_ids)[2]
    flat_ids = (state.alive_ids[:, 0] if first
                else tf.reshape(state.alive_ids, tf.stack([-1, width])))
    logits, cache = config.symbols_to_logits_fn(flat_ids, state.step, state.alive_cache)
    log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32))
    if first:  # slots 1..k-1 are dead: their extensions are -inf
        dead = tf.fill(tf.stack([tf.shape(log_probs)[0], beam - 1, vocab]), NEG_INF)
        log_probs = tf.concat([log_probs[:, tf.newaxis], dead], axis=1)
    # PAD marks the end of the buffer and BOS its start: never generate them.
    never = tf.logical_or(tf.range(vocab) == PAD_ID, tf.range(vocab) == config.bos_id)
    for token in config.never_ids:  # <unk> under a byte-fallback vocabulary
        never = tf.logical_or(never, tf.range(vocab) == token)
    model_log_probs = tf.reshape(log_probs, [-1, beam, vocab])
    log_probs = prefix_lib.force(config.prefix, tf.where(never, NEG_INF, model_log_probs),
                                 model_log_probs, state.sentence, state.step)
    candidates = state.alive_log_probs[:, :, tf.newaxis] + log_probs  # [batch, beam, vocab]
    # tf.math.top_k's result, ties included, without sorting beam * vocab candidates.
    top_log_probs, top_index = chunked_top_k(tf.reshape(candidates, [-1, beam * vocab]), beam)
    parents = top_index // vocab
    tokens = top_index % vocab
    ids = state.alive_ids
    if beam > 1:
        ids = tf.gather(ids, parents, batch_dims=1)
    new_column = tf.range(width) == state.step + 1
    ids = tf.where(new_column, tokens[:, :, tf.newaxis], ids)
    return top_log_probs, ids, parents, tokens, cache


def _new_finished(config: SearchConfig, state: BeamState, log_probs, ids, ends):
    """Merges the extensions that ended into the k best finished hypotheses.

    Returns (ids [batch, beam, width], scores [batch, beam] sorted descending,
    lengths [batch, beam]), unchanged for sentences already done, and the merge's
    index [batch, beam] into [finished, extensions].
    """
    length = state.step + 1
    scores = tf.where(ends, log_probs / length_penalty(length, config.alpha), NEG_INF)
    all_scores = tf.concat([state.finished_scores, scores], axis=1)  # [batch, 2 * beam]
    all_ids = tf.concat([state.finished_ids, ids], axis=1)
    all_lengths = tf.concat([state.finished_lengths, tf.fill(tf.shape(scores), length)], axis=1)
    # top_k keeps the lower index first among ties: old finished before new.
    top_scores, index = tf.math.top_k(all_scores, k=config.beam_size)
    top_ids = tf.gather(all_ids, index, batch_dims=1)
    top_lengths = tf.gather(all_lengths, index, batch_dims=1)
    keep = state.done[:, tf.newaxis]
    return (tf.where(keep[:, :, tf.newaxis], state.finished_ids, top_ids),
            tf.where(keep, state.finished_scores, top_scores),
            tf.where(keep, state.finished_lengths, top_lengths), index)


def _update_done(config: SearchConfig, step, alive_log_probs, finished_scores,
                 state: BeamState) -> tf.Tensor:
    """The stopping rule of the module docstring, per sentence: bool [rows]."""
    best_alive = tf.reduce_max(alive_log_probs, axis=1)
    max_penalty = tf.maximum(length_penalty(step + 1, config.alpha),
                             length_penalty(state.max_lengths, config.alpha))
    bound = best_alive / max_penalty
    needed = finished_scores[:, config.nbest - 1]
    return state.done | (step >= state.max_lengths) | (bound <= needed)
