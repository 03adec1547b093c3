"""x W + b over the last axis, as one 2-D GEMM.

tf.matmul of a [batch, length, d] activation and a [d, n] kernel runs as a
broadcasting BatchMatMulV2, whose kernel gradient is `batch` partial products
summed afterwards; flattening the leading axes makes forward and both
gradients single MatMuls (BUILD.md, performance decisions). Which kernel runs
the product is the caller's `Kernels` policy (model/kernels.py).
"""

import tensorflow as tf

from tf_transformer.model import kernels as kernels_lib
from tf_transformer.model import shapes


def linear(x: tf.Tensor, kernel, bias=None, activation=None,
           kernels: kernels_lib.Kernels = kernels_lib.TRAINING) -> tf.Tensor:
    """activation([..., d] x [d, n] (+ [n])) -> [..., n], in x's dtype.

    The activation runs before the reshape back, so MatMul, BiasAdd and Relu
    stay adjacent and Grappler's remapper fuses them into one oneDNN kernel.
    """
    kernel = tf.cast(kernel, x.dtype)
    head = shapes.dims(x, -1)
    y = kernels.projection(tf.reshape(x, [-1, kernel.shape[0]]), kernel)
    if bias is not None:
        y = tf.nn.bias_add(y, tf.cast(bias, x.dtype))
    if activation is not None:
        y = activation(y)
    return tf.reshape(y, head + [kernel.shape[-1]])
