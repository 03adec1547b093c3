"""Beam search with the GNMT length penalty and a provable early stop (section 6.1).

The search is model-independent: a model enters only through
`symbols_to_logits_fn(ids, step, cache) -> (logits, cache)`. Its state has fixed
shapes (k alive and k finished hypotheses per sentence, a token buffer of
`max_length + 1` columns), so one trace serves every batch size and the loop
compiles under XLA.

The state and one step, with the length penalty and the stopping rule (and
its proof), are beam_step.py's; this module runs the loop over them.

A done sentence has no alive hypotheses and its finished state is frozen. By
default (`shrink`) it leaves the working batch after the step that finished it
(live_rows.py); its results go to a full-size buffer in the caller's order.
With a static buffer (XLA) the batch instead rides at full size until
`advance` ends, the loop ending with the slowest sentence; decoding/compiled_search.py then
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

Alignments (`alignment_width`, off by default): the search also keeps each
hypothesis's attention over the source and returns the chosen ones'
(AlignedSearchResult; search/alignment.py).
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from tf_transformer.config import BOS_ID, EOS_ID, PAD_ID
from tf_transformer.search import alignment, live_rows
from tf_transformer.search import prefix as prefix_lib
from tf_transformer.search.beam_step import length_penalty, search_step  # noqa: F401 (the API)
from tf_transformer.search.state import (  # noqa: F401 (BeamCache: the protocol)
    NEG_INF, BeamCache, BeamState, Cache, SearchConfig, SymbolsToLogitsFn, empty_results)


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


class AlignedSearchResult(NamedTuple):
    """BeamSearchResult's fields and the hypotheses' alignments: float32 [batch,
    nbest, length, S], row t the attention of the step that chose ids[..., t]
    (search/alignment.py); 0 past a hypothesis's length."""

    ids: tf.Tensor
    scores: tf.Tensor
    lengths: tf.Tensor
    alignments: tf.Tensor


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
      never_ids: more token ids never generated, as PAD and BOS (the Translator
        passes <unk> for a vocabulary with byte fallback); default none.
      alignment_width: S, to keep alignments (search/alignment.py):
        symbols_to_logits_fn then returns (logits, cache, attention float32
        [batch * beam, S]) and `finish` an AlignedSearchResult. None: off.
      prefix: a search/prefix.py TargetPrefix: each sentence's outputs start with its
        prefix tokens (its max_length raised to the prefix's length + 1). None: free.
      row_buckets: with `shrink`, the working sentences are kept at a bucket of
        search/shape_buckets.py (done ones stay as padding until the next bucket
        down): bounded shapes, the same outputs.
    """

    def __init__(self, symbols_to_logits_fn: SymbolsToLogitsFn, *, vocab_size: int,
                 beam_size: int, alpha: float | tf.Tensor, max_lengths: tf.Tensor,
                 eos_id: int = EOS_ID, bos_id: int = BOS_ID, nbest: int = 1,
                 batch_size: int | None = None, max_decode_length: int | None = None,
                 shrink: bool | None = None, never_ids: tuple[int, ...] = (),
                 alignment_width=None, prefix: prefix_lib.TargetPrefix | None = None,
                 row_buckets: bool = False):
        if beam_size < 1:
            raise ValueError(f"beam_size must be >= 1, got {beam_size}")
        if not 1 <= nbest <= beam_size:
            raise ValueError(f"nbest must be in [1, beam_size={beam_size}], got {nbest}")
        if vocab_size <= max(PAD_ID, bos_id, eos_id):
            raise ValueError(f"vocab_size={vocab_size} does not cover the special ids")
        max_lengths = prefix_lib.raise_max_lengths(prefix, tf.cast(max_lengths, tf.int32))
        if batch_size is None:
            batch_size = max_lengths.shape[0]
            if batch_size is None:
                batch_size = tf.shape(max_lengths)[0]
        self.shrink = max_decode_length is None if shrink is None else shrink
        if max_decode_length is None:
            max_decode_length = tf.maximum(tf.reduce_max(max_lengths), 1)
        max_lengths = tf.clip_by_value(max_lengths, 1, max_decode_length)
        self.batch_size, self.max_decode_length = batch_size, max_decode_length
        self.config = SearchConfig(symbols_to_logits_fn, vocab_size, beam_size,
                                   tf.cast(alpha, tf.float32), max_lengths, eos_id, bos_id,
                                   nbest, tuple(int(i) for i in never_ids),
                                   alignment_width, prefix, row_buckets)

    def start(self, initial_cache: Cache) -> BeamState:
        """The state after the first step: before it, one alive hypothesis (BOS) per
        sentence and the other slots dead, so that step runs the model on one row
        per sentence (not `beam` copies of BOS) and tiles the cache after it."""
        beam, batch, width = self.config.beam_size, self.batch_size, self.max_decode_length + 1
        row = tf.where(tf.range(width) == 0, self.config.bos_id, PAD_ID)  # [width]
        alive_ids = tf.broadcast_to(row, tf.stack([batch, beam, width]))
        # Only slot 0 is live, so the first step does not grow k copies of BOS.
        first = tf.constant([0.0] + [NEG_INF] * (beam - 1))
        aligned = self.config.alignment_width
        history = () if aligned is None else alignment.empty_history(batch, beam, width, aligned)
        state = BeamState(
            step=tf.constant(0, tf.int32),
            alive_ids=alive_ids,
            alive_log_probs=tf.tile(first[tf.newaxis], tf.stack([batch, 1])),
            alive_cache=initial_cache if beam > 1 else live_rows.tile(initial_cache, beam),
            finished_ids=tf.fill(tf.shape(alive_ids), PAD_ID),
            finished_scores=tf.fill(tf.stack([batch, beam]), NEG_INF),
            finished_lengths=tf.zeros(tf.stack([batch, beam]), tf.int32),
            done=tf.zeros(tf.stack([batch]), tf.bool),
            max_lengths=self.config.max_lengths,
            sentence=tf.range(batch),
            results=empty_results(batch, self.config.nbest, width, aligned),
            alive_attention=history, finished_attention=history)
        if beam == 1:  # the untiled cache is already one row per hypothesis
            return state
        return search_step(self.config, state, self.shrink and live_rows.can_compact(
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
            return (search_step(self.config, state, shrink),)

        (state,) = tf.while_loop(cond, body, (state,),
                                 shape_invariants=(_shape_invariants(state),))
        return state

    def finish(self, state: BeamState) -> BeamSearchResult | AlignedSearchResult:
        """The nbest best finished hypotheses in the caller's order, BOS dropped;
        empty slots blanked; with alignments an AlignedSearchResult."""
        results = live_rows.write_results(state)
        scores = results.scores
        empty = scores == NEG_INF
        ids = tf.where(empty[:, :, tf.newaxis], PAD_ID, results.ids[:, :, 1:])
        lengths = tf.where(empty, 0, results.lengths)
        if self.config.alignment_width is None:
            return BeamSearchResult(ids=ids, scores=scores, lengths=lengths)
        alignments = tf.where(empty[:, :, tf.newaxis, tf.newaxis], 0.0,
                              results.attention[:, :, 1:])
        return AlignedSearchResult(ids, scores, lengths, alignments)


def _shape_invariants(state: BeamState) -> BeamState:
    """Static shapes with rows free to vary, and every cache dimension (a
    model's cache may grow by a position per step)."""
    def free_first(t):
        return tf.TensorShape([None]).concatenate(t.shape[1:])
    invariants = tf.nest.map_structure(lambda t: free_first(t) if t.shape.rank else t.shape, state)
    free_cache = tf.nest.map_structure(lambda t: tf.TensorShape([None] * t.shape.rank),
                                       state.alive_cache)
    return invariants._replace(alive_cache=free_cache)
