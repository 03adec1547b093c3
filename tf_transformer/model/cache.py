"""The incremental decoding cache: one interface, three implementations.

A self-attention cache holds the keys and values of the positions decoded so
far, [batch, h, L, d_k] and [batch, h, L, d_v]. Every kind answers the same two
questions, so `SelfAttention.step` and `Transformer.decode_step` need no mode:
  write(k, v, step) -> the cache with step `step`'s key/value stored;
  bias(step)        -> the additive float32 bias the query at `step` attends with.
`GrowingCache` appends (L = positions so far): every step copies the cache,
which makes it the plain reference the tests hold the others to.
`ChunkedCache` (graph mode's default) keeps a buffer that grows by CHUNK
positions when full: a step writes its column into that buffer in place (no
copy of the cache) and attends over at most CHUNK - 1 masked columns, so the
attention products take one shape per chunk instead of one per step (oneDNN
builds a kernel per shape: BUILD.md, performance decisions).
`FixedCache` scatters into a buffer of static length L and masks later
positions: the shapes XLA needs; `padded(L')` moves it to a longer buffer
between two loops (a short first buffer serves outputs that stop early).

`DecoderCache` is the model's whole cache. It follows beam_search's cache
protocol (`tile`, `reorder`, `compact`): the self-attention caches follow their
beams, while the projected encoder memory and its bias, the same for every beam
of a sentence, keep one row per sentence: never tiled, never reordered (cross
attention folds a sentence's beam into its query axis, so each step reads the
memory once per sentence, not once per hypothesis); `compact` gathers their
sentences when finished ones leave the batch (decoding/live_rows.py).
All classes are NamedTuples, so the cache is a nest that tf.while_loop and
XLA carry as it is.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Union

import tensorflow as tf

from tf_transformer.model import kernels, masks


class GrowingCache(NamedTuple):
    """Keys/values of positions 0..step-1; `write` appends position `step`."""

    keys: tf.Tensor  # [batch, h, step, d_k]
    values: tf.Tensor  # [batch, h, step, d_v]

    def write(self, k: tf.Tensor, v: tf.Tensor, step) -> "GrowingCache":
        """k [batch, h, 1, d_k], v [batch, h, 1, d_v] become position `step` (== L)."""
        return GrowingCache(tf.concat([self.keys, k], axis=2), tf.concat([self.values, v], axis=2))

    def bias(self, step) -> float:
        """Every cached position is at or before `step`: nothing to mask."""
        return 0.0


def _scatter(buffer: tf.Tensor, column: tf.Tensor, step) -> tf.Tensor:
    """buffer [batch, h, L, d] with column [batch, h, 1, d] written at position `step`.

    A scatter, not a select: XLA updates the buffer in place (TensorFlow's
    kernel copies it, as a concat would: measured inside a tf.while_loop).
    """
    batch, heads = tf.shape(column)[0], tf.shape(column)[1]
    rows, head = tf.meshgrid(tf.range(batch), tf.range(heads), indexing="ij")
    index = tf.stack([rows, head, tf.fill(tf.shape(rows), step)], axis=-1)
    return tf.tensor_scatter_nd_update(buffer, index, column[:, :, 0])


def _write_in_place(buffer: tf.Tensor, column: tf.Tensor, index: tf.Tensor) -> tf.Tensor:
    """`_scatter` without the copy (kernels.write_rows_in_place): rows `index` of
    `buffer` as [batch * h * L, d], those that hold one position.

    Safe only on a buffer nobody else reads: ChunkedCache's buffers are made by
    `chunked()`'s Empty ops, the chunk's pad, or the search's tile or reorder
    gather, each a new tensor that only this write reads before the step's
    attention.
    """
    depth = buffer.shape[-1] if buffer.shape[-1] is not None else tf.shape(buffer)[-1]
    written = kernels.write_rows_in_place(tf.reshape(buffer, [-1, depth]), index,
                                          tf.reshape(column, [-1, depth]))
    return tf.reshape(written, tf.shape(buffer))


class ChunkedCache(NamedTuple):
    """Keys/values of positions 0..step-1 in a buffer of L >= step columns, L a
    multiple of `CHUNK`; `write` grows it by CHUNK columns when it is full.
    Steps must run from 0 in order (graph mode's loop): L follows from `step`.
    `write` updates the buffers in place, so a cache must not be read after it
    has been written to (decode_step's caller keeps only the returned one)."""

    keys: tf.Tensor  # [batch, h, L, d_k]
    values: tf.Tensor  # [batch, h, L, d_v]

    CHUNK = 16

    def write(self, k: tf.Tensor, v: tf.Tensor, step) -> "ChunkedCache":
        """k [batch, h, 1, d_k], v [batch, h, 1, d_v] become position `step`."""
        def grown():
            pad = [[0, 0], [0, 0], [0, self.CHUNK], [0, 0]]
            return tf.pad(self.keys, pad), tf.pad(self.values, pad)

        # Full exactly when `step` starts a chunk after the first (no shape op on the
        # buffer).
        keys, values = tf.cond(tf.logical_and(step > 0, step % self.CHUNK == 0), grown,
                               lambda: (self.keys, self.values))
        # Row (row * h + head) * L + step of the flattened buffers, the same for both.
        shape = tf.shape(k)
        index = tf.range(shape[0] * shape[1]) * self.length(step) + step
        return ChunkedCache(_write_in_place(keys, k, index), _write_in_place(values, v, index))

    def length(self, step) -> tf.Tensor:
        """L once position `step` is written: the chunks that hold 0..step."""
        return (step // self.CHUNK + 1) * self.CHUNK

    def bias(self, step) -> tf.Tensor:
        """[1, 1, 1, L]: keys 0..step visible, the chunk's unwritten columns masked."""
        return masks.attention_bias(masks.step_mask(step, self.length(step)))


class FixedCache(NamedTuple):
    """Keys/values in a buffer of static length L; positions after `step` are masked."""

    keys: tf.Tensor  # [batch, h, L, d_k]
    values: tf.Tensor  # [batch, h, L, d_v]

    def write(self, k: tf.Tensor, v: tf.Tensor, step) -> "FixedCache":
        """Scatters k [batch, h, 1, d_k], v [batch, h, 1, d_v] into column `step`.

        A scatter, not a select: XLA updates the buffer in place, where a
        select rewrites all of it every step.
        """
        return FixedCache(_scatter(self.keys, k, step), _scatter(self.values, v, step))

    def bias(self, step) -> tf.Tensor:
        """[1, 1, 1, L]: keys 0..step visible (masks.step_mask)."""
        return masks.attention_bias(masks.step_mask(step, tf.shape(self.keys)[2]))

    def padded(self, length) -> "FixedCache":
        """The same positions in a buffer of `length` >= L columns."""
        def pad(t):
            return tf.pad(t, [[0, 0], [0, 0], [0, length - tf.shape(t)[2]], [0, 0]])
        return FixedCache(pad(self.keys), pad(self.values))


SelfAttentionCache = Union[GrowingCache, ChunkedCache, FixedCache]
# (batch, num_heads, d_k, d_v, dtype) -> an empty self-attention cache.
EmptyCache = Callable[..., SelfAttentionCache]


def growing() -> EmptyCache:
    """Empty growing caches (graph mode): L starts at 0."""
    def empty(batch, num_heads, d_k, d_v, dtype) -> GrowingCache:
        return GrowingCache(tf.zeros([batch, num_heads, 0, d_k], dtype),
                            tf.zeros([batch, num_heads, 0, d_v], dtype))
    return empty


def chunked() -> EmptyCache:
    """Empty chunked caches (graph mode) of one chunk each.

    Each buffer is its own zero tensor (kernels.distinct_zeros): two `tf.zeros` of
    one shape would be merged into one tensor (common subexpressions), and so
    would every pad, tile and gather of it after, leaving the keys and values of
    every layer in one buffer that each in-place write overwrites.
    """
    def empty(batch, num_heads, d_k, d_v, dtype) -> ChunkedCache:
        def buffer(depth):
            shape = tf.stack([batch, num_heads, ChunkedCache.CHUNK, depth])
            return kernels.distinct_zeros(shape, dtype)
        return ChunkedCache(buffer(d_k), buffer(d_v))
    return empty


def fixed(length) -> EmptyCache:
    """Empty fixed caches of `length` positions (XLA)."""
    def empty(batch, num_heads, d_k, d_v, dtype) -> FixedCache:
        return FixedCache(tf.zeros([batch, num_heads, length, d_k], dtype),
                          tf.zeros([batch, num_heads, length, d_v], dtype))
    return empty


# An optional table a search did not make (DecoderCache.output_table, position_table):
# an empty nest, so the loop state holds no placeholder tensor (a constant there broke
# XLA's conversion of the capacity stages' tf.cond).
NOT_MADE = ()


def made(table) -> bool:
    """Whether an optional table of DecoderCache holds a tensor (not NOT_MADE)."""
    return not isinstance(table, tuple)


def tile_rows(t: tf.Tensor, beam: int) -> tf.Tensor:
    """[batch, ...] -> [batch * beam, ...], row b * beam + j copies row b."""
    return tf.repeat(t, beam, axis=0)


class DecoderCache(NamedTuple):
    """The model's decoding cache.

    self_attention: layer i's SelfAttentionCache, [rows, ...], reordered with
      the beams (rows = sentences * beam once tiled).
    memory_keys, memory_values: layer i's projected encoder memory,
      [sentences, h, S, d_k] and [sentences, h, S, d_v]: one row per sentence,
      shared by its beam (CrossAttention.step).
    memory_bias: [sentences, 1, 1, S] source padding bias.
    output_table: [d_model, vocab], the shared embedding table transposed once
      per search for the output projection (Embedding.logits), or NOT_MADE
      where the step reads the table itself (Transformer.initial_cache's
      transpose_output); never tiled, reordered or compacted.
    position_table: [P, d_model] float32, the position vectors of decoding
      positions 0..P-1, made once per search (graph mode: a step then reads
      its row instead of computing sinusoids), or NOT_MADE where each step makes its
      own (XLA, where they fuse); never tiled, reordered or compacted.
    """

    self_attention: tuple
    memory_keys: tuple
    memory_values: tuple
    memory_bias: tf.Tensor
    output_table: tf.Tensor | tuple
    position_table: tf.Tensor | tuple = NOT_MADE

    def tile(self, beam: int) -> "DecoderCache":
        """Self-attention rows repeated `beam` times (beam_search's cache protocol);
        the memory stays one row per sentence."""
        return self._replace(self_attention=tf.nest.map_structure(
            lambda t: tile_rows(t, beam), self.self_attention))

    def reorder(self, rows: tf.Tensor) -> "DecoderCache":
        """Self-attention rows gathered to `rows` [rows]; memory untouched."""
        self_attention = tf.nest.map_structure(lambda t: tf.gather(t, rows), self.self_attention)
        return self._replace(self_attention=self_attention)

    def compact(self, rows: tf.Tensor) -> "DecoderCache":
        """A reorder that may drop sentences: rows int32 [n * beam], each run of
        `beam` rows one sentence's (old row = sentence * beam + slot); the
        memory follows the n sentences."""
        beam = tf.shape(self.self_attention[0].keys)[0] // tf.shape(self.memory_bias)[0]
        sentences = tf.reshape(rows, [-1, beam])[:, 0] // beam
        memory = tf.nest.map_structure(
            lambda t: tf.gather(t, sentences),
            (self.memory_keys, self.memory_values, self.memory_bias))
        return self.reorder(rows)._replace(memory_keys=memory[0], memory_values=memory[1],
                                           memory_bias=memory[2])

    def padded(self, length) -> "DecoderCache":
        """Every FixedCache moved to a buffer of `length` positions."""
        return self._replace(self_attention=tuple(c.padded(length) for c in self.self_attention))
