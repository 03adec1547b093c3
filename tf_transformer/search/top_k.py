"""An exact top-k over long rows in two short passes: `chunked_top_k`.

Why: beam search takes the k best of beam * vocab extensions per sentence
(32,000 candidates at beam 4, vocab 8k) each step. Under XLA on the CPU,
`tf.math.top_k` over a row that long is lowered to a sort of the whole row;
a maximum per chunk of `chunk` candidates, the top-k of those maxima, then
the top-k of the k chosen chunks reads every candidate once and sorts only
short rows.

Exact, ties included: the k best candidates (by value, the lower index first
among equals, which is tf.math.top_k's order) lie in the k best chunks
ranked the same way by their maxima. If a chunk holding one of them, e, were
not chosen, each of the k chosen chunks would hold a candidate that comes
before e (a greater maximum, or an equal one at a lower index), so e would
not be among the k best. The chosen chunks are then gathered in index order,
so the second pass sees the candidates in their original order and breaks
ties as `tf.math.top_k` does on the whole row.
"""

from __future__ import annotations

import tensorflow as tf

CHUNK = 128


def chunked_top_k(values: tf.Tensor, k: int, chunk: int = CHUNK) -> tuple[tf.Tensor, tf.Tensor]:
    """tf.math.top_k(values, k) for float values [rows, n] (n >= k): (values, int32 indices)
    [rows, k], best first, the lower index first among equals."""
    n = values.shape[-1]
    if n is None or n <= 2 * chunk or k > n // chunk:
        return tf.math.top_k(values, k=k)
    chunks = -(-n // chunk)
    rows = tf.shape(values)[0]
    # Padding goes last, so it loses every tie with a real candidate (even -inf).
    padded = tf.pad(values, [[0, 0], [0, chunks * chunk - n]],
                    constant_values=float("-inf"))
    blocks = tf.reshape(padded, [rows, chunks, chunk])
    _, best = tf.math.top_k(tf.reduce_max(blocks, axis=2), k=k)  # [rows, k]
    best = tf.sort(best, axis=1)  # index order, so the second pass breaks ties as top_k
    candidates = tf.reshape(tf.gather(blocks, best, batch_dims=1), [rows, k * chunk])
    top_values, position = tf.math.top_k(candidates, k=k)
    block = tf.gather(best, position // chunk, batch_dims=1)
    return top_values, block * chunk + position % chunk
