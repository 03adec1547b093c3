"""Finished sentences leave the beam search's working batch.

Why: the loop runs until a batch's slowest sentence is done, and a done
sentence that stays in the batch still costs its decoder step, the vocabulary
projection, top-k and cache reorder (on sorted test batches only ~34% of row-steps were live).

The working state (state.BeamState) holds only some of the caller's
sentences: `sentence` int32 [rows] names each working row's sentence, and
`results` (full size, in the caller's order) receives a sentence's n-best
list when it leaves (`write_results`). Two ways to leave:
  graph mode (`drop_done`): after a step with a newly done sentence, the live
    sentences' rows are gathered; the cache gather is the step's beam reorder
    itself, with the rows of the parents of live sentences only, so dropping
    costs no extra copy of the self-attention cache (the encoder memory, never
    reordered, is gathered on those steps only).
  XLA (`pack`, decoding/compiled_search.py): shapes are static, so the state moves to a
    smaller capacity between two loops, live sentences first.

The cache: a plain nest is gathered whole, so it can always shrink. A
`BeamCache` shrinks if it has `compact(rows)` (rows int32 [n * beam]: a
reorder that gathers every part, shared ones included, and may drop rows);
one without keeps every sentence (today's search).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tf_transformer.search import shape_buckets
from tf_transformer.search.state import BeamCache, BeamState, Results

# The BeamState fields with one row per working sentence (the cache aside); the
# attention fields are () without alignments.
ROW_FIELDS = ("alive_ids", "alive_log_probs", "finished_ids", "finished_scores",
              "finished_lengths", "done", "max_lengths", "sentence", "alive_attention",
              "finished_attention")


def write_results(state: BeamState) -> Results:
    """Every working row's n-best finished hypotheses scattered to its sentence.

    A done row's finished state is frozen, so writing it again is harmless.
    """
    nbest = state.results.scores.shape[1]
    index = state.sentence[:, tf.newaxis]
    attention = tf.nest.map_structure(
        lambda results, rows: tf.tensor_scatter_nd_update(results, index, rows[:, :nbest]),
        state.results.attention, state.finished_attention)
    return Results(
        tf.tensor_scatter_nd_update(state.results.ids, index, state.finished_ids[:, :nbest]),
        tf.tensor_scatter_nd_update(state.results.scores, index,
                                    state.finished_scores[:, :nbest]),
        tf.tensor_scatter_nd_update(state.results.lengths, index,
                                    state.finished_lengths[:, :nbest]), attention)


def tile(cache: Any, beam: int) -> Any:
    """[batch, ...] -> [batch * beam, ...], row b * beam + j copies row b."""
    if isinstance(cache, BeamCache):
        return cache.tile(beam)
    return tf.nest.map_structure(lambda t: tf.repeat(t, beam, axis=0), cache)


def reorder(cache: Any, rows: tf.Tensor) -> Any:
    """Row i <- row rows[i]: the cache's own reorder, or a gather of the whole nest."""
    if isinstance(cache, BeamCache):
        return cache.reorder(rows)
    return tf.nest.map_structure(lambda t: tf.gather(t, rows), cache)


def can_compact(cache: Any) -> bool:
    """Whether the cache can drop rows (module docstring)."""
    return not isinstance(cache, BeamCache) or hasattr(cache, "compact")


def compact(cache: Any, rows: tf.Tensor) -> Any:
    """Row i <- row rows[i] for every part; rows int32 [n * beam] may drop rows."""
    if isinstance(cache, BeamCache):
        return cache.compact(rows)
    return tf.nest.map_structure(lambda t: tf.gather(t, rows), cache)


def _take(state: BeamState, keep: tf.Tensor, cache_rows: tf.Tensor) -> BeamState:
    """The working rows `keep` int32 [n], the cache's rows `cache_rows` [n * beam];
    what leaves is written to the results first."""
    taken = {name: tf.nest.map_structure(lambda t: tf.gather(t, keep), getattr(state, name))
             for name in ROW_FIELDS}
    return state._replace(results=write_results(state),
                          alive_cache=compact(state.alive_cache, cache_rows), **taken)


def drop_done(state: BeamState, rows: tf.Tensor, beam: int,
              reorder_rows: bool = True, bucketed: bool = False) -> BeamState:
    """Graph mode, after a step: the beam reorder of the cache (row i <- rows[i],
    rows int32 [rows * beam], the parents), and, if some sentence is done, the
    done sentences dropped within that same gather. `reorder_rows=False`: the rows
    already follow their parents (the first step's tiled cache); only dropping
    gathers. `bucketed`: the working sentences fall only from one bucket of
    shape_buckets.rows to a smaller one, live sentences first, done ones filling
    the bucket (they are frozen: their results stay as they are)."""
    live = tf.logical_not(state.done)
    if bucketed:
        working = tf.shape(state.done)[0]
        target = tf.minimum(shape_buckets.rows(tf.reduce_sum(tf.cast(live, tf.int32))), working)
        leave = target < working
    else:
        leave = tf.reduce_any(state.done)

    def shrink():
        if bucketed:
            keep = tf.argsort(tf.cast(state.done, tf.int32), stable=True)[:target]
        else:
            keep = tf.cast(tf.where(live)[:, 0], tf.int32)  # [n]
        cache_rows = tf.reshape(tf.gather(tf.reshape(rows, [-1, beam]), keep), [-1])
        return _take(state, keep, cache_rows)

    def keep_all():
        if beam == 1 or not reorder_rows:  # the parent of slot 0 is always slot 0
            return state
        return state._replace(alive_cache=reorder(state.alive_cache, rows))

    return tf.cond(leave, shrink, keep_all)


def pack(state: BeamState, capacity: int, beam: int) -> BeamState:
    """XLA, between two loops: the first `capacity` working rows, live ones first
    (every live sentence must fit: at most `capacity` are live). Static shapes."""
    keep = tf.argsort(tf.cast(state.done, tf.int32), stable=True)[:capacity]
    cache_rows = tf.reshape(keep[:, tf.newaxis] * beam + tf.range(beam), [-1])
    return _take(state, keep, cache_rows)
