"""The beam search's types: its state between steps, its fixed arguments, the
cache protocol and the results of sentences that left the working rows.

beam_step.py runs one step over them, live_rows.py moves rows in and out,
beam_search.py runs the loop.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Protocol, runtime_checkable

import tensorflow as tf

from tf_transformer.config import PAD_ID

# A BeamCache, or nested dicts/lists of tensors whose first dimension is the batch.
Cache = Any
SymbolsToLogitsFn = Callable[[tf.Tensor, tf.Tensor, Cache], tuple[tf.Tensor, Cache]]

NEG_INF = float("-inf")


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
    results: Results  # [batch, nbest, ...]: of sentences that left the rows
    # With alignments (search/alignment.py), float32 [rows, beam, width, S]: each
    # hypothesis's attention over the source per ids column; () without.
    alive_attention: Any = ()
    finished_attention: Any = ()


@runtime_checkable
class BeamCache(Protocol):
    """A cache that tiles and reorders itself (beam_search's docstring): tile makes
    row b * beam + j a copy of row b; reorder(rows int32 [batch * beam]) makes
    row i old row rows[i] wherever that matters. Optional, to shrink
    (live_rows.py): compact(rows int32 [n * beam]) does so for every part."""

    def tile(self, beam: int) -> "BeamCache": ...

    def reorder(self, rows: tf.Tensor) -> "BeamCache": ...


class Results(NamedTuple):
    """The n-best lists of sentences that left the working rows, caller's order."""

    ids: tf.Tensor  # int32 [batch, nbest, width], BOS first
    scores: tf.Tensor  # float32 [batch, nbest], -inf if empty
    lengths: tf.Tensor  # int32 [batch, nbest]
    attention: Any = ()  # float32 [batch, nbest, width, S] with alignments, else ()


def empty_results(batch, nbest: int, width, alignment_width=None) -> Results:
    attention = () if alignment_width is None else tf.zeros(
        tf.stack([batch, nbest, width, alignment_width]), tf.float32)
    return Results(tf.fill(tf.stack([batch, nbest, width]), PAD_ID),
                   tf.fill(tf.stack([batch, nbest]), float("-inf")),
                   tf.zeros(tf.stack([batch, nbest]), tf.int32), attention)


class SearchConfig(NamedTuple):
    """The search's fixed arguments, passed to each named step."""

    symbols_to_logits_fn: SymbolsToLogitsFn
    vocab_size: int
    beam_size: int
    alpha: tf.Tensor
    max_lengths: tf.Tensor  # int32 [batch], clipped to [1, max_decode_length]: the loop's end
    eos_id: int
    bos_id: int
    nbest: int
    never_ids: tuple[int, ...] = ()  # never generated, besides PAD and BOS
    # S, the source length the model's step attention spans, to keep alignments
    # (search/alignment.py); None: none kept, and symbols_to_logits_fn returns 2 values.
    alignment_width: Any = None
    # search/prefix.py's TargetPrefix: outputs forced to start with it; None: free.
    prefix: Any = None
    # Shrinking keeps the working sentences at a bucket (search/shape_buckets.py).
    row_buckets: bool = False
