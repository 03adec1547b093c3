"""The machine's matmul peak, which train_throughput and the side-by-side protocol's MFU
divide by."""

import time


def matmul_peak(dtype, size=2048, repeats=8) -> float:
    """Best-of-N FLOP/s of a size^3 matmul through TensorFlow."""
    import tensorflow as tf

    a = tf.cast(tf.random.normal([size, size]), dtype)
    b = tf.cast(tf.random.normal([size, size]), dtype)
    matmul = tf.function(tf.matmul)
    matmul(a, b).numpy()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(a, b).numpy()
        best = min(best, time.perf_counter() - start)
    return 2 * size ** 3 / best
