"""Multi-head scaled dot-product attention (section 3.2): self and cross attention.

Why our own layers rather than keras.layers.MultiHeadAttention or keras-hub's
blocks: the paper's rows A/B vary d_k and d_v independently of d_model/h
(keras-hub fixes them to d_model/h); self-attention uses one fused
[d_model, h*(2*d_k + d_v)] projection (one GEMM instead of three); cross
attention projects the encoder memory once per sentence so every decoding step
reuses it; and the decoding cache (model/cache.py) may have a fixed shape,
which XLA needs. `SelfAttention` and `CrossAttention` differ only in where
queries, keys and values come from; both end in the same `attend`. Every
product runs on the kernels of the caller's `Kernels` policy (model/kernels.py):
TRAINING by default, STEP for a decoding step.
"""

import math

import keras
import tensorflow as tf

from tf_transformer.model import kernels as kernels_lib
from tf_transformer.model import shapes
from tf_transformer.model.cache import SelfAttentionCache
from tf_transformer.model.kernels import Kernels
from tf_transformer.model.layers.dropout import Dropout
from tf_transformer.model.layers.linear import linear


def _uniform(fan_in: int, fan_out: int) -> keras.initializers.Initializer:
    """Glorot-uniform limits of the unfused projection, for a fused kernel."""
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    return keras.initializers.RandomUniform(-limit, limit)


class _Attention(keras.layers.Layer):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O, head_i = softmax(Q K^T / sqrt(d_k)) V.

    Args:
      d_model: width of queries, memory and output.
      num_heads: h.
      d_k: width of each head's queries and keys.
      d_v: width of each head's values.
      attention_dropout: dropout on the attention weights (0 in the paper).

    Masks arrive as an additive float32 `bias` broadcastable to
    [batch, heads, query_length, key_length] (see masks.py).
    """

    def __init__(self, d_model, num_heads, d_k, d_v, attention_dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_k = d_k
        self.d_v = d_v
        self.attention_dropout = attention_dropout
        self.weights_dropout = Dropout(attention_dropout, dtype=self.dtype_policy)

    def _kernel(self, name: str, fan_out: int, width: int):
        """A [d_model, width] kernel and its bias (Glorot limits of fan_out)."""
        d = self.d_model
        kernel = self.add_weight(name=f"{name}_kernel", shape=(d, width),
                                 initializer=_uniform(d, fan_out))
        bias = self.add_weight(name=f"{name}_bias", shape=(width,), initializer="zeros")
        return kernel, bias

    def build(self, input_shape=None):
        h, d_v, d = self.num_heads, self.d_v, self.d_model
        self.output_kernel = self.add_weight(
            name="output_kernel", shape=(h * d_v, d), initializer=_uniform(h * d_v, d))
        self.output_bias = self.add_weight(name="output_bias", shape=(d,), initializer="zeros")
        self.weights_dropout.build(None)
        self.built = True

    def split_heads(self, x, depth):
        """[batch, length, h*depth] -> [batch, h, length, depth].

        A decoding step's single position (length 1, static) needs no transpose:
        the reshape alone puts the heads first.
        """
        if x.shape[1] == 1:
            return tf.reshape(x, shapes.dims(x, 1) + [self.num_heads, 1, depth])
        x = tf.reshape(x, shapes.dims(x, 2) + [self.num_heads, depth])
        return tf.transpose(x, [0, 2, 1, 3])

    def attention_weights(self, q, k, bias, kernels: Kernels = kernels_lib.TRAINING):
        """softmax(Q K^T / sqrt(d_k) + bias), computed in float32: [batch, h, T, S]."""
        q = q * tf.cast(self.d_k ** -0.5, q.dtype)
        logits = kernels.attention(q, k, adj_y=True)
        return kernels.softmax(tf.cast(logits, tf.float32) + tf.cast(bias, tf.float32))

    def attend(self, q, k, v, bias, training=None, rows=None,
               kernels: Kernels = kernels_lib.TRAINING, return_weights: bool = False,
               dropout_key=None):
        """q [b, h, T, d_k], k [b, h, S, d_k], v [b, h, S, d_v] -> [b, T, d_model], or
        to the leading dimensions `rows` when the query axis folds several rows
        (CrossAttention.step). With `return_weights`: (that, the attention weights
        float32 [b, h, T, S] before dropout). `dropout_key` picks the weights' dropout
        mask (layers/dropout.py)."""
        probabilities = self.attention_weights(q, k, bias, kernels)
        weights = self.weights_dropout(probabilities, training=training, dropout_key=dropout_key)
        heads = kernels.attention(tf.cast(weights, v.dtype), v)  # [batch, h, T, d_v]
        if heads.shape[2] == 1 and rows is None:  # one query (a decoding step): a reshape
            heads = tf.reshape(heads, shapes.dims(heads, 1) + [1, self.num_heads * self.d_v])
        else:
            heads = tf.transpose(heads, [0, 2, 1, 3])  # [batch, T, h, d_v]
            heads = tf.reshape(heads, (rows or shapes.dims(heads, 2))
                               + [self.num_heads * self.d_v])
        output = linear(heads, self.output_kernel, self.output_bias, kernels=kernels)
        return (output, probabilities) if return_weights else output

    def get_config(self):
        config = super().get_config()
        config.update(d_model=self.d_model, num_heads=self.num_heads, d_k=self.d_k,
                      d_v=self.d_v, attention_dropout=self.attention_dropout)
        return config


@keras.saving.register_keras_serializable(package="tf_transformer")
class SelfAttention(_Attention):
    """Queries, keys and values from one input through one fused projection (qkv_kernel)."""

    def build(self, input_shape=None):
        h = self.num_heads
        self.qkv_kernel, self.qkv_bias = self._kernel("qkv", h * self.d_k,
                                                      h * (2 * self.d_k + self.d_v))
        super().build(input_shape)

    def project(self, x, kernels: Kernels = kernels_lib.TRAINING):
        """[batch, T, d_model] -> q, k [batch, h, T, d_k], v [batch, h, T, d_v]."""
        qkv = linear(x, self.qkv_kernel, self.qkv_bias, kernels=kernels)
        hk = self.num_heads * self.d_k
        q, k, v = tf.split(qkv, [hk, hk, self.num_heads * self.d_v], axis=-1)
        return (self.split_heads(q, self.d_k), self.split_heads(k, self.d_k),
                self.split_heads(v, self.d_v))

    def call(self, x, bias, training=None, kernels: Kernels = kernels_lib.TRAINING,
             dropout_key=None):
        """Full pass: x [batch, T, d_model], bias [batch|1, 1, T|1, T] -> [batch, T, d_model]."""
        q, k, v = self.project(x, kernels)
        return self.attend(q, k, v, bias, training, kernels=kernels, dropout_key=dropout_key)

    def step(self, x, cache: SelfAttentionCache, step, kernels: Kernels = kernels_lib.STEP):
        """One decoding step (no dropout): x [batch, 1, d_model] at position `step`.

        The cache stores this position's key/value and says what may be
        attended (model/cache.py). Returns (output [batch, 1, d_model], cache).
        """
        q, k, v = self.project(x, kernels)
        cache = cache.write(tf.cast(k, cache.keys.dtype), tf.cast(v, cache.values.dtype), step)
        return self.attend(q, cache.keys, cache.values, cache.bias(step), kernels=kernels), cache


@keras.saving.register_keras_serializable(package="tf_transformer")
class CrossAttention(_Attention):
    """Encoder-decoder attention: queries from the decoder (query_kernel), keys and
    values from the encoder memory (one fused key_value_kernel)."""

    def build(self, input_shape=None):
        h = self.num_heads
        self.query_kernel, self.query_bias = self._kernel("query", h * self.d_k, h * self.d_k)
        self.key_value_kernel, self.key_value_bias = self._kernel(
            "key_value", h * self.d_k, h * (self.d_k + self.d_v))
        super().build(input_shape)

    def project_memory(self, memory, kernels: Kernels = kernels_lib.TRAINING):
        """Encoder memory [batch, S, d_model] -> keys [b, h, S, d_k], values [b, h, S, d_v]."""
        kv = linear(memory, self.key_value_kernel, self.key_value_bias, kernels=kernels)
        k, v = tf.split(kv, [self.num_heads * self.d_k, self.num_heads * self.d_v], axis=-1)
        return self.split_heads(k, self.d_k), self.split_heads(v, self.d_v)

    def call(self, x, memory, bias, training=None, kernels: Kernels = kernels_lib.TRAINING,
             dropout_key=None):
        """x [batch, T, d_model], memory [batch, S, d_model], bias [batch, 1, 1|T, S]."""
        q = self.split_heads(linear(x, self.query_kernel, self.query_bias, kernels=kernels),
                             self.d_k)
        return self.attend(q, *self.project_memory(memory, kernels), bias, training,
                           kernels=kernels, dropout_key=dropout_key)

    def step(self, x, memory_keys, memory_values, bias, kernels: Kernels = kernels_lib.STEP,
             return_weights: bool = False):
        """Decoding: x [rows, T, d_model] over memory projected by `project_memory`,
        [batch, h, S, d]; bias [batch, 1, 1, S]. Returns [rows, T, d_model], and with
        `return_weights` also the attention weights averaged over heads, float32
        [rows, T, S] (the alignments of search/alignment.py).

        rows = batch * group: a sentence's `group` consecutive rows (its beam
        hypotheses) share its memory row and are folded into one query axis of
        group * T, so each sentence's keys and values are read once, in one
        [group * T, S] product instead of group [T, S] ones, and the memory is
        never tiled.
        """
        batch = memory_keys.shape[0]
        batch = tf.shape(memory_keys)[0] if batch is None else batch
        q = linear(x, self.query_kernel, self.query_bias, kernels=kernels)
        q = tf.transpose(tf.reshape(q, [batch, -1, self.num_heads, self.d_k]), [0, 2, 1, 3])
        rows = shapes.dims(x, 2)
        out = self.attend(q, memory_keys, memory_values, bias, rows=rows, kernels=kernels,
                          return_weights=return_weights)
        if not return_weights:
            return out
        output, weights = out  # weights [batch, h, group * T, S]
        mean = tf.reduce_mean(weights, axis=1)  # [batch, group * T, S]
        return output, tf.reshape(mean, rows + [tf.shape(mean)[-1]])
