"""Beam search with the GNMT length penalty and a provable early stop (section 6.1).

The search is model-independent: a model enters only through
`symbols_to_logits_fn(ids, step, cache) -> (logits, cache)`. Its state has fixed
shapes (k alive and k finished hypotheses per sentence, a token buffer of
`max_length + 1` columns), so one trace serves every batch size and the loop
compiles under XLA.

Each step has three named parts:
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

A done sentence has no alive hypotheses and its finished state is frozen. By
default (`shrink`) it leaves the working batch after the step that finished it
(live_rows.py); its results go to a full-size buffer in the caller's order.
With a static buffer (XLA) the batch instead rides at full size until
`advance` ends, the loop ending with the slowest sentence; xla_search.py then
moves the live ones to a smaller static capacity (live_rows.pack).

The cache. The first step (`start`) runs the model on `initial_cache` as it is,
one row per sentence, since only slot 0 is alive then; its result is tiled from
[batch, ...] to [batch * beam, ...] and, after every later step, its rows follow
their hypotheses' parents. A plain nest
(dicts, lists, tensors) is tiled and reordered whole. An object with
`tile(beam)` and `reorder(rows)` (the `BeamCache` protocol; model/cache.py's
DecoderCache) does both itself, so what every beam shares (encoder memory) is
never tiled and gathered only by `compact`, when finished sentences leave
(live_rows.py). A
cache may change shape between two `advance` calls (XLA: a short buffer first,
padded if decoding goes on); within one it keeps its shapes under XLA, and in
graph mode may grow by a position per step.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import tensorflow as tf

from tf_transformer.config import BOS_ID, EOS_ID, PAD_ID
from tf_transformer.decoding import live_rows
from tf_transformer.decoding.live_rows import BeamCache  # noqa: F401 (the protocol)
from tf_transformer.decoding.top_k import chunked_top_k

# A BeamCache, or nested dicts/lists of tensors whose first dimension is the batch.
Cache = Any
SymbolsToLogitsFn = Callable[[tf.Tensor, tf.Tensor, Cache], tuple[tf.Tensor, Cache]]

_NEG_INF = float("-inf")


class BeamSearchResult(NamedTuple):
    """The n-best hypotheses of each sentence, best first.

    ids: int32 [batch, nbest, length], without BOS; EOS where the hypothesis
      ended with one, PAD after. length is max(max_lengths) (or
      max_decode_length when given).
    scores: float32 [batch, nbest], log-prob / length_penalty(lengths).
    lengths: int32 [batch, nbest], tokens including EOS.
    A slot for which no hypothesis exists (only with a vocabulary smaller than
    the beam) has score -inf, length 0 and PAD ids.
    """

    ids: tf.Tensor
    scores: tf.Tensor
    lengths: tf.Tensor


class BeamState(NamedTuple):
    """The search's state between steps, over `rows` working sentences (all of
    the batch, or the live ones: live_rows.py); fixed shapes but for the
    cache's and the number of rows."""

    step: tf.Tensor  # int32 []: tokens decoded so far by every alive hypothesis
    alive_ids: tf.Tensor  # int32 [rows, beam, width]: BOS, tokens, PAD; width = max_length + 1
    alive_log_probs: tf.Tensor  # float32 [rows, beam]: -inf for a dead slot
    alive_cache: Cache  # nested, each [rows * beam, ...], row b * beam + j
    finished_ids: tf.Tensor  # int32 [rows, beam, width]
    finished_scores: tf.Tensor  # float32 [rows, beam]: sorted descending, -inf if empty
    finished_lengths: tf.Tensor  # int32 [rows, beam]
    done: tf.Tensor  # bool [rows]: the sentence's n-best list can no longer change
    max_lengths: tf.Tensor  # int32 [rows]: clipped to [1, max_decode_length]
    sentence: tf.Tensor  # int32 [rows]: the row's index in the caller's batch
    results: live_rows.Results  # [batch, nbest, ...]: of sentences that left the rows


def length_penalty(length, alpha) -> tf.Tensor:
    """GNMT length penalty ((5 + |Y|) / 6) ** alpha, float32, shaped like `length`."""
    length = tf.cast(length, tf.float32)
    return tf.pow((5.0 + length) / 6.0, tf.cast(alpha, tf.float32))


def beam_search(symbols_to_logits_fn: SymbolsToLogitsFn, initial_cache: Cache,
                **settings) -> BeamSearchResult:
    """Decodes a batch of sentences with beam search (see the module docstring).

    `settings` are BeamSearch's keyword arguments. Returns BeamSearchResult with
    ids [batch, nbest, width - 1], scores and lengths [batch, nbest], best first.
    """
    search = BeamSearch(symbols_to_logits_fn, **settings)
    return search.finish(search.advance(search.start(initial_cache)))


class BeamSearch:
    """One search's settings; `start`, `advance` and `finish` run it in stages.

    Args:
      symbols_to_logits_fn: (ids int32 [batch * beam, width], step int32 [],
        cache) -> (logits [batch * beam, vocab], cache). Column 0 of ids is BOS,
        columns 1..step the tokens so far, later columns PAD; the token at
        column `step` is the input. Any float dtype; the search uses float32.
      vocab_size: static size of the logits' last dimension.
      beam_size: k; 1 is greedy decoding.
      alpha: length penalty exponent (0.6 in the paper).
      max_lengths: int32 [batch], each sentence's maximum output length,
        EOS included (the paper: source length + 50); clipped to >= 1.
      eos_id, bos_id: token ids. PAD and BOS are never generated: their
        log-probs are set to -inf after the log-softmax (not renormalized), so
        scores stay the model's log-probs.
      nbest: outputs per sentence, 1 <= nbest <= beam_size.
      batch_size: static batch size, if known; otherwise read from max_lengths.
      max_decode_length: width - 1 of the ids buffer, max(max_lengths) by
        default. Under XLA give a static one (a buffer sized by the values of
        max_lengths would compile once per distinct value); max_lengths is
        then clipped to it.
      shrink: done sentences leave the working rows after each step
        (live_rows.py); default: unless max_decode_length is given (a static
        buffer asks for static shapes). The outputs are the same.
    """

    def __init__(self, symbols_to_logits_fn: SymbolsToLogitsFn, *, vocab_size: int,
                 beam_size: int, alpha: float | tf.Tensor, max_lengths: tf.Tensor,
                 eos_id: int = EOS_ID, bos_id: int = BOS_ID, nbest: int = 1,
                 batch_size: int | None = None, max_decode_length: int | None = None,
                 shrink: bool | None = None):
        if beam_size < 1:
            raise ValueError(f"beam_size must be >= 1, got {beam_size}")
        if not 1 <= nbest <= beam_size:
            raise ValueError(f"nbest must be in [1, beam_size={beam_size}], got {nbest}")
        if vocab_size <= max(PAD_ID, bos_id, eos_id):
            raise ValueError(f"vocab_size={vocab_size} does not cover the special ids")
        max_lengths = tf.cast(max_lengths, tf.int32)
        if batch_size is None:
            batch_size = max_lengths.shape[0]
            if batch_size is None:
                batch_size = tf.shape(max_lengths)[0]
        self.shrink = max_decode_length is None if shrink is None else shrink
        if max_decode_length is None:
            max_decode_length = tf.maximum(tf.reduce_max(max_lengths), 1)
        max_lengths = tf.clip_by_value(max_lengths, 1, max_decode_length)
        self.batch_size, self.max_decode_length = batch_size, max_decode_length
        self.config = _Config(symbols_to_logits_fn, vocab_size, beam_size,
                              tf.cast(alpha, tf.float32), max_lengths, eos_id, bos_id, nbest)

    def start(self, initial_cache: Cache) -> BeamState:
        """The state after the first step: before it, one alive hypothesis (BOS) per
        sentence and the other slots dead, so that step runs the model on one row
        per sentence (not `beam` copies of BOS) and tiles the cache after it."""
        beam, batch, width = self.config.beam_size, self.batch_size, self.max_decode_length + 1
        row = tf.where(tf.range(width) == 0, self.config.bos_id, PAD_ID)  # [width]
        alive_ids = tf.broadcast_to(row, tf.stack([batch, beam, width]))
        # Only slot 0 is live, so the first step does not grow k copies of BOS.
        first = tf.constant([0.0] + [_NEG_INF] * (beam - 1))
        state = BeamState(
            step=tf.constant(0, tf.int32),
            alive_ids=alive_ids,
            alive_log_probs=tf.tile(first[tf.newaxis], tf.stack([batch, 1])),
            alive_cache=initial_cache if beam > 1 else live_rows.tile(initial_cache, beam),
            finished_ids=tf.fill(tf.shape(alive_ids), PAD_ID),
            finished_scores=tf.fill(tf.stack([batch, beam]), _NEG_INF),
            finished_lengths=tf.zeros(tf.stack([batch, beam]), tf.int32),
            done=tf.zeros(tf.stack([batch]), tf.bool),
            max_lengths=self.config.max_lengths,
            sentence=tf.range(batch),
            results=live_rows.empty_results(batch, self.config.nbest, width))
        if beam == 1:  # the untiled cache is already one row per hypothesis
            return state
        return _search_step(self.config, state, self.shrink and live_rows.can_compact(
            initial_cache), first=True)

    def advance(self, state: BeamState, until=None, live_above: int | None = None) -> BeamState:
        """Steps until every sentence is done, `step` reaches `until` (default:
        the longest max_length), or at most `live_above` sentences are live
        (XLA's capacity stages; the rows then never shrink within the loop)."""
        last = tf.reduce_max(self.config.max_lengths)
        last = last if until is None else tf.minimum(last, until)
        shrink = (self.shrink and live_above is None
                  and live_rows.can_compact(state.alive_cache))
        live_above = 0 if live_above is None else live_above

        def cond(state: BeamState) -> tf.Tensor:
            live = tf.reduce_sum(tf.cast(tf.logical_not(state.done), tf.int32))
            return tf.logical_and(state.step < last, live > live_above)

        def body(state: BeamState) -> tuple[BeamState]:
            return (_search_step(self.config, state, shrink),)

        (state,) = tf.while_loop(cond, body, (state,),
                                 shape_invariants=(_shape_invariants(state),))
        return state

    def finish(self, state: BeamState) -> BeamSearchResult:
        """The nbest best finished hypotheses in the caller's order, BOS dropped;
        empty slots blanked."""
        results = live_rows.write_results(state)
        scores = results.scores
        empty = scores == _NEG_INF
        ids = tf.where(empty[:, :, tf.newaxis], PAD_ID, results.ids[:, :, 1:])
        lengths = tf.where(empty, 0, results.lengths)
        return BeamSearchResult(ids=ids, scores=scores, lengths=lengths)


class _Config(NamedTuple):
    """The search's fixed arguments, passed to each named step."""

    symbols_to_logits_fn: SymbolsToLogitsFn
    vocab_size: int
    beam_size: int
    alpha: tf.Tensor
    max_lengths: tf.Tensor  # int32 [batch], clipped to [1, max_decode_length]: the loop's end
    eos_id: int
    bos_id: int
    nbest: int


def _shape_invariants(state: BeamState) -> BeamState:
    """Static shapes with rows free to vary, and every cache dimension (a
    model's cache may grow by a position per step)."""
    def free_first(t):
        return tf.TensorShape([None]).concatenate(t.shape[1:])
    invariants = tf.nest.map_structure(lambda t: free_first(t) if t.shape.rank else t.shape, state)
    free_cache = tf.nest.map_structure(lambda t: tf.TensorShape([None] * t.shape.rank),
                                       state.alive_cache)
    return invariants._replace(alive_cache=free_cache)


def _search_step(config: _Config, state: BeamState, shrink: bool,
                 first: bool = False) -> BeamState:
    """One step: grow alive, new alive, new finished, the stopping rule, then the
    cache rows follow their parents (and, with `shrink`, done sentences leave).

    `first`: the cache holds one row per sentence (only slot 0 is alive), the
    model runs on those rows and the cache is tiled to the beam afterwards; every
    copy is its parent's, so no reorder is needed but for done sentences leaving.
    """
    log_probs, ids, parents, tokens, cache = _grow_alive(config, state, first)
    # Extensions that end here: by EOS, or forced at the sentence's max length.
    ends = tf.logical_or(tokens == config.eos_id,
                         (state.step + 1 >= state.max_lengths)[:, tf.newaxis])
    # new alive: the extensions that go on (-inf where one ended or the sentence is done).
    alive_log_probs = tf.where(tf.logical_or(ends, state.done[:, tf.newaxis]), _NEG_INF, log_probs)
    finished_ids, finished_scores, finished_lengths = _new_finished(
        config, state, log_probs, ids, ends)
    step = state.step + 1
    done = _update_done(config, step, alive_log_probs, finished_scores, state)
    # A done sentence keeps no alive hypotheses, so it cannot touch its results.
    alive_log_probs = tf.where(done[:, tf.newaxis], _NEG_INF, alive_log_probs)
    state = state._replace(step=step, alive_ids=ids, alive_log_probs=alive_log_probs,
                           alive_cache=cache, finished_ids=finished_ids,
                           finished_scores=finished_scores,
                           finished_lengths=finished_lengths, done=done)
    beam = config.beam_size
    rows = tf.reshape(parents + tf.range(tf.shape(parents)[0])[:, tf.newaxis] * beam, [-1])
    if first:
        state = state._replace(alive_cache=live_rows.tile(cache, beam))
        return live_rows.drop_done(state, rows, beam, reorder_rows=False) if shrink else state
    if shrink:
        return live_rows.drop_done(state, rows, beam)
    if beam == 1:  # the parent of slot 0 is always slot 0
        return state
    return state._replace(alive_cache=live_rows.reorder(cache, rows))


def _grow_alive(config: _Config, state: BeamState, first: bool = False):
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
        dead = tf.fill(tf.stack([tf.shape(log_probs)[0], beam - 1, vocab]), _NEG_INF)
        log_probs = tf.concat([log_probs[:, tf.newaxis], dead], axis=1)
    # PAD marks the end of the buffer and BOS its start: never generate them.
    never = tf.logical_or(tf.range(vocab) == PAD_ID, tf.range(vocab) == config.bos_id)
    log_probs = tf.where(never, _NEG_INF, tf.reshape(log_probs, [-1, beam, vocab]))
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


def _new_finished(config: _Config, state: BeamState, log_probs, ids, ends):
    """Merges the extensions that ended into the k best finished hypotheses.

    Returns (ids [batch, beam, width], scores [batch, beam] sorted descending,
    lengths [batch, beam]); unchanged for sentences already done.
    """
    length = state.step + 1
    scores = tf.where(ends, log_probs / length_penalty(length, config.alpha), _NEG_INF)
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
            tf.where(keep, state.finished_lengths, top_lengths))


def _update_done(config: _Config, step, alive_log_probs, finished_scores,
                 state: BeamState) -> tf.Tensor:
    """The stopping rule of the module docstring, per sentence: bool [rows]."""
    best_alive = tf.reduce_max(alive_log_probs, axis=1)
    max_penalty = tf.maximum(length_penalty(step + 1, config.alpha),
                             length_penalty(state.max_lengths, config.alpha))
    bound = best_alive / max_penalty
    needed = finished_scores[:, config.nbest - 1]
    return state.done | (step >= state.max_lengths) | (bound <= needed)
