"""x W + b over the last axis, as one 2-D GEMM.

tf.matmul of a [batch, length, d] activation and a [d, n] kernel runs as a
broadcasting BatchMatMulV2, whose kernel gradient is `batch` partial products
summed afterwards; flattening the leading axes makes forward and both
gradients single MatMuls (measured: BUILD.md, "Training speed").

A decoding step's products (one position), and every product traced inside
`eigen_products()` (the Translator's encoder and memory projection), run
`step_matmul` instead.
"""

import contextlib

import tensorflow as tf

from tf_transformer.model import shapes


def step_matmul(x, y, adj_y=False):
    """A decoding product: x y (or x y^T), as BatchMatMulV3. `tf.matmul` is
    MatMul or BatchMatMulV2, which oneDNN (AVX-512 CPUs) rewrites, building and
    keeping a kernel for every new shape, and a step's shapes change all the time
    (the cache grows, sentences leave): memory for the process's life, and no
    faster here (BUILD.md, "Decoding"). BatchMatMulV3 (the same product with its
    output type explicit) has no oneDNN rewrite, so it runs Eigen's kernel; XLA
    compiles it like the others."""
    return tf.raw_ops.BatchMatMulV3(x=x, y=y, Tout=x.dtype, adj_y=adj_y)


_eigen_products = False  # set while tracing inside `eigen_products()`


@contextlib.contextmanager
def eigen_products():
    """`linear`s traced inside run `step_matmul`. For inference graphs whose shapes
    change from call to call (the encoder of each batch's source width), where
    oneDNN would keep a kernel per shape; training never enters it. Read at trace
    time. (The encoder's attention products stay oneDNN's: on Eigen they cost
    batch-1 latency, BUILD.md "Decoding".)"""
    global _eigen_products
    previous, _eigen_products = _eigen_products, True
    try:
        yield
    finally:
        _eigen_products = previous


def linear(x: tf.Tensor, kernel, bias=None, activation=None) -> tf.Tensor:
    """activation([..., d] x [d, n] (+ [n])) -> [..., n], in x's dtype.

    The activation runs before the reshape back, so MatMul, BiasAdd and Relu
    stay adjacent and Grappler's remapper fuses them into one oneDNN kernel.
    A decoding step's x, [rows, 1, d] (one static position), and any x inside
    `eigen_products()`, go through `step_matmul` instead.
    """
    kernel = tf.cast(kernel, x.dtype)
    head = shapes.dims(x, -1)
    one_position = x.shape.rank == 3 and x.shape[1] == 1
    matmul = step_matmul if one_position or _eigen_products else tf.matmul
    y = matmul(tf.reshape(x, [-1, kernel.shape[0]]), kernel)
    if bias is not None:
        y = tf.nn.bias_add(y, tf.cast(bias, x.dtype))
    if activation is not None:
        y = activation(y)
    return tf.reshape(y, head + [kernel.shape[-1]])
