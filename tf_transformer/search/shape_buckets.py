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
  the source width: a multiple of WIDTH_MULTIPLE (PAD columns, masked as any PAD);
  the cache length grows by chunks already (model/cache.py's ChunkedCache).
Outputs are those of the unpadded search (tested).
"""

from __future__ import annotations

import tensorflow as tf

from tf_transformer.config import PAD_ID

ROW_STEP = 4
WIDTH_MULTIPLE = 16


def rows(n) -> tf.Tensor:
    """int32: the bucket of n sentences (n >= 0): 1, 2, 4, then the next multiple of ROW_STEP."""
    n = tf.maximum(tf.cast(n, tf.int32), 1)
    small = tf.where(n <= 1, 1, tf.where(n <= 2, 2, 4))
    return tf.where(n <= ROW_STEP, small, -(-n // ROW_STEP) * ROW_STEP)


def row_buckets(max_rows: int) -> list[int]:
    """Every bucket `rows` gives for 1..max_rows sentences, ascending (warmup visits them)."""
    return sorted({int(rows(n)) for n in range(1, max_rows + 1)})


def pad_sources(source_ids: tf.Tensor, max_width: int) -> tf.Tensor:
    """int32 [B, S] -> [rows(B), S rounded up to WIDTH_MULTIPLE, at most max_width (S if
    more: a model's learned positions end there)]: PAD rows and columns added."""
    shape = tf.shape(source_ids)
    width = tf.maximum(tf.minimum(-(-shape[1] // WIDTH_MULTIPLE) * WIDTH_MULTIPLE, max_width),
                       shape[1])
    return tf.pad(source_ids, [[0, rows(shape[0]) - shape[0]], [0, width - shape[1]]],
                  constant_values=PAD_ID)


def pad_rows(t: tf.Tensor, count) -> tf.Tensor:
    """`t` [B, ...] with rows of PAD after it, to `count` rows."""
    padding = [[0, count - tf.shape(t)[0]]] + [[0, 0]] * (t.shape.rank - 1)
    return tf.pad(t, padding, constant_values=tf.cast(PAD_ID, t.dtype))
