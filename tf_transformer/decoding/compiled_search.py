"""The Translator's XLA search (DecodeConfig.jit_compile): compiled shapes and a staged cache.

XLA compiles per input shape, so the batch is padded to a power of two
(filler rows repeat the last sentence, so they finish with it) and the source
to a multiple of LENGTH_BUCKET: each new (batch, length, extra_length)
compiles once per process. Inside, every shape is static: the ids buffer and
the cache hold the padded source length + extra_length positions (capped at
the model's max_positions). The cache is a FixedCache (model/cache.py) of
FIRST_CACHE_LENGTH positions for the first steps, padded once to the full
length if some sentence is still going: a batch whose outputs stop early never
copies, reorders or attends over the long buffer. Outputs are cut back to the
caller's batch and to the graph path's ids width, so they are the graph path's.

Finished sentences leave the batch by capacity stages (`capacities`): the
state holds C sentences, C from a small static set (the padded batch B, then
B / CAPACITY_FACTOR ** k, at least 1, for k up to STAGES); once at most the
next capacity is live, live sentences are packed first into the smaller state
(live_rows.pack) and decoding goes on there. The function is traced for any
batch, so the capacities are tensors that XLA folds to constants; a stage
whose capacity equals the next one's sits in a `tf.cond` with a constant
predicate, which XLA removes before it compiles (batch 1 compiles one stage).
The short cache serves the first stage only (later stages, at a quarter of
the rows or less, run on the full one): STAGES + 2 loop bodies to compile
instead of 2, so CAPACITY_FACTOR and STAGES trade steps on finished rows
for compile time (BUILD.md, performance decisions).
"""

from __future__ import annotations

import tensorflow as tf

from tf_transformer.config import EOS_ID, PAD_ID
from tf_transformer.decoding.model_search import ModelSearch
from tf_transformer.model import cache
from tf_transformer.search import live_rows
from tf_transformer.search.beam_search import BeamSearchResult

LENGTH_BUCKET = 16  # sources padded to a multiple of this many tokens
FIRST_CACHE_LENGTH = 32  # steps on a short cache before it is padded to full length
CAPACITY_FACTOR = 4  # each capacity stage holds 1/CAPACITY_FACTOR of the previous one's rows
STAGES = 2  # capacity switches at most: 32 sentences -> 8 -> 2


def capacities(batch, factor: int = CAPACITY_FACTOR, stages: int = STAGES) -> list:
    """The state sizes, largest first: batch, then batch // factor ** k (at least
    1) for k = 1..stages; ints for an int batch, else int32 scalars."""
    if isinstance(batch, int):
        return [batch] + [max(batch // factor ** k, 1) for k in range(1, stages + 1)]
    return [batch] + [tf.maximum(batch // factor ** k, 1) for k in range(1, stages + 1)]


def pad_to_compiled_shape(source_ids: tf.Tensor, max_source_length: int) -> tf.Tensor:
    """int32 [B, S] -> [B', S']: B' the next power of two >= B, S' the next multiple
    of LENGTH_BUCKET (at most max_source_length, at least S and 1).

    Filler rows repeat the last row; an empty batch gets rows of a lone EOS.
    """
    batch, length = tf.shape(source_ids)[0], tf.shape(source_ids)[1]
    padded_length = -(-length // LENGTH_BUCKET) * LENGTH_BUCKET
    padded_length = tf.maximum(tf.minimum(padded_length, max_source_length),
                               tf.maximum(length, 1))
    powers = 2 ** tf.range(31)
    padded_batch = tf.reduce_min(tf.boolean_mask(powers, powers >= batch))
    padded = tf.pad(source_ids, [[0, 0], [0, padded_length - length]], constant_values=PAD_ID)
    empty_row = tf.one_hot(0, padded_length, on_value=EOS_ID, off_value=PAD_ID, dtype=tf.int32)
    rows = tf.range(padded_batch)
    rows = tf.where(rows < batch, rows, tf.maximum(batch - 1, 0))
    return tf.gather(tf.concat([padded, empty_row[tf.newaxis]], 0), rows)


def fixed_shape_search(searches: ModelSearch, source_ids, alpha, extra_length,
                       nbest: int) -> BeamSearchResult:
    """The search with static shapes (source_ids' shape and extra_length are
    compile-time constants): capacity stages (module docstring), the first on
    a short FixedCache while step < FIRST_CACHE_LENGTH, then on the full one."""
    model = searches.model
    width = tf.minimum(tf.shape(source_ids)[1] + extra_length, searches.max_target_length)
    first_length = tf.minimum(FIRST_CACHE_LENGTH, width)
    search = searches.beam_search(source_ids, alpha, extra_length, nbest, max_decode_length=width)
    memory = model.encode(source_ids, training=False)
    sizes = capacities(tf.shape(source_ids)[0])
    # Each stage decodes until at most the next capacity is live (0: to the end).
    exits = [tf.where(smaller < size, smaller, 0) for size, smaller in zip(sizes, sizes[1:])]
    exits.append(0)
    first = model.initial_cache(memory, source_ids, cache.fixed(first_length),
                                transpose_output=False)
    state = search.advance(search.start(first), until=first_length, live_above=exits[0])
    state = state._replace(alive_cache=state.alive_cache.padded(width))
    state = search.advance(state, live_above=exits[0])
    for k in range(1, len(sizes)):
        state = live_rows.pack(state, sizes[k], searches.beam_size)
        state = tf.cond(sizes[k] < sizes[k - 1],  # a constant for XLA: else not compiled
                        lambda: search.advance(state, live_above=exits[k]), lambda: state)
    return search.finish(state)


class CompiledSearch:
    """The jit-compiled search per nbest, built on first use. A plain object,
    so SavedModel tracking ignores it (the functions are saved where called)."""

    def __init__(self, searches: ModelSearch):
        self._searches = searches
        self._functions = {}

    def __call__(self, source_ids, alpha, extra_length, nbest: int) -> BeamSearchResult:
        """source_ids int32 [B, S] -> the graph path's BeamSearchResult for them."""
        searches = self._searches
        source_ids = tf.convert_to_tensor(source_ids, tf.int32)
        padded = pad_to_compiled_shape(source_ids, searches.max_source_length)
        ids, scores, lengths = self._function(nbest)(padded, alpha, extra_length)
        # The graph path's ids width: the batch's longest allowed output.
        width = tf.maximum(tf.reduce_max(searches.max_lengths(source_ids, extra_length)), 1)
        batch = tf.shape(source_ids)[0]
        return BeamSearchResult(ids[:batch, :, :width], scores[:batch], lengths[:batch])

    def _function(self, nbest: int):
        if nbest not in self._functions:
            def compiled_search(source_ids, alpha, extra_length):
                return tuple(fixed_shape_search(self._searches, source_ids, alpha,
                                                extra_length, nbest))

            self._functions[nbest] = tf.function(compiled_search, autograph=False, jit_compile=True)
        return self._functions[nbest]
