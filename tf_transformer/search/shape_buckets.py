"""Bounded shapes: every tensor a graph-mode search creates has one of a fixed set of shapes.

Why: a long-running server meets batches of any size and sentences of any length,
and inside a search the working rows fall as sentences finish. TensorFlow's oneDNN
kernels (and oneDNN's GEMM behind Eigen's contractions) build and keep a primitive
per new shape, so a server that keeps meeting new shapes keeps growing (and pays
each primitive's creation on the request that meets it). With bounded shapes the
set is fixed by the largest batch and source length, warmup can visit it, and
memory stops growing once it has been seen.

Three sizes vary with the data, each rounded up to a bucket:
  the request's sentences and, inside the search, the sentences still working:
    `rows(n)`: 1, 2, 4, then multiples of ROW_STEP (the extra rows are padding
    sentences, done from the first step, or done sentences kept as padding);
  the source width: MIN_WIDTH or the next power of two, at most the model's
    `max_width` (PAD columns, masked as any PAD): few widths, so warmup can visit
    every (rows, width) pair (exporters/warmup.py); the padded columns cost the
    encoder and cross-attention's scores only, a small part of a search;
  the cache length grows by chunks already (model/cache.py's ChunkedCache).
Outputs are those of the unpadded search (tested).
"""

from __future__ import annotations

import tensorflow as tf

from tf_transformer.config import PAD_ID

ROW_STEP = 4
MIN_WIDTH = 16


def rows(n) -> tf.Tensor:
    """int32: the bucket of n sentences (n >= 0): 1, 2, 4, then the next multiple of ROW_STEP."""
    n = tf.maximum(tf.cast(n, tf.int32), 1)
    small = tf.where(n <= 1, 1, tf.where(n <= 2, 2, 4))
    return tf.where(n <= ROW_STEP, small, -(-n // ROW_STEP) * ROW_STEP)


def row_buckets(max_rows: int) -> list[int]:
    """Every bucket `rows` gives for 1..max_rows sentences, ascending (warmup visits them)."""
    return sorted({int(rows(n)) for n in range(1, max_rows + 1)})


def width_buckets(max_width: int) -> list[int]:
    """The source widths' buckets: MIN_WIDTH, its doubles below max_width, max_width."""
    buckets, power = [], MIN_WIDTH
    while power < max_width:
        buckets.append(power)
        power *= 2
    return buckets + [max_width]


def width(s, max_width: int) -> tf.Tensor:
    """int32: the bucket of a source width s, the smallest of width_buckets(max_width) that
    holds it (s itself past max_width: a model's learned positions end there)."""
    s = tf.cast(s, tf.int32)
    bucket = s
    for candidate in reversed(width_buckets(max_width)):
        bucket = tf.where(s <= candidate, candidate, bucket)
    return bucket


def pad_sources(source_ids: tf.Tensor, max_width: int) -> tf.Tensor:
    """int32 [B, S] -> [rows(B), width(S, max_width)]: PAD rows and columns added."""
    shape = tf.shape(source_ids)
    columns = width(shape[1], max_width)
    return tf.pad(source_ids, [[0, rows(shape[0]) - shape[0]], [0, columns - shape[1]]],
                  constant_values=PAD_ID)


def pad_rows(t: tf.Tensor, count) -> tf.Tensor:
    """`t` [B, ...] with rows of PAD after it, to `count` rows."""
    padding = [[0, count - tf.shape(t)[0]]] + [[0, 0]] * (t.shape.rank - 1)
    return tf.pad(t, padding, constant_values=tf.cast(PAD_ID, t.dtype))
