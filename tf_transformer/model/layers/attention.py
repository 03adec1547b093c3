"""Multi-head scaled dot-product attention (section 3.2).

Why our own layer rather than keras.layers.MultiHeadAttention or keras-hub's
blocks: the paper's rows A/B vary d_k and d_v independently of d_model/h
(keras-hub fixes them to d_model/h); self-attention uses one fused
[d_model, h*(2*d_k + d_v)] projection (one GEMM instead of three); cross
attention projects the encoder memory once per sentence so every decoding step
reuses it; and the decoding cache has a fixed shape, which XLA and
`tf.while_loop` need.
"""

import math

import keras
import tensorflow as tf

from tf_transformer.model.layers.linear import linear


def _uniform(fan_in: int, fan_out: int) -> keras.initializers.Initializer:
    """Glorot-uniform limits of the unfused projection, for a fused kernel."""
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    return keras.initializers.RandomUniform(-limit, limit)


@keras.saving.register_keras_serializable(package="tf_transformer")
class MultiHeadAttention(keras.layers.Layer):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O, head_i = softmax(Q K^T / sqrt(d_k)) V.

    Args:
      d_model: width of queries, memory and output.
      num_heads: h.
      d_k: width of each head's queries and keys.
      d_v: width of each head's values.
      attention_dropout: dropout on the attention weights (0 in the paper).
      self_attention: True for self-attention (queries, keys and values from one
        input, fused projection); False for encoder-decoder attention.

    Masks arrive as an additive float32 `bias` broadcastable to
    [batch, heads, query_length, key_length] (see masks.py).
    """

    def __init__(self, d_model, num_heads, d_k, d_v, attention_dropout=0.0,
                 self_attention=True, **kwargs):
        super().__init__(**kwargs)
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_k = d_k
        self.d_v = d_v
        self.attention_dropout = attention_dropout
        self.self_attention = self_attention
        self.weights_dropout = keras.layers.Dropout(attention_dropout, dtype=self.dtype_policy)

    def build(self, input_shape=None):
        h, d_k, d_v, d = self.num_heads, self.d_k, self.d_v, self.d_model
        if self.self_attention:
            width = h * (2 * d_k + d_v)
            self.qkv_kernel = self.add_weight(
                name="qkv_kernel", shape=(d, width), initializer=_uniform(d, h * d_k))
            self.qkv_bias = self.add_weight(name="qkv_bias", shape=(width,), initializer="zeros")
        else:
            self.query_kernel = self.add_weight(
                name="query_kernel", shape=(d, h * d_k), initializer=_uniform(d, h * d_k))
            self.query_bias = self.add_weight(name="query_bias", shape=(h * d_k,), initializer="zeros")
            width = h * (d_k + d_v)
            self.key_value_kernel = self.add_weight(
                name="key_value_kernel", shape=(d, width), initializer=_uniform(d, h * d_k))
            self.key_value_bias = self.add_weight(
                name="key_value_bias", shape=(width,), initializer="zeros")
        self.output_kernel = self.add_weight(
            name="output_kernel", shape=(h * d_v, d), initializer=_uniform(h * d_v, d))
        self.output_bias = self.add_weight(name="output_bias", shape=(d,), initializer="zeros")
        self.weights_dropout.build(None)
        self.built = True

    # -- projections ------------------------------------------------------
    def _dense(self, x, kernel, bias):
        return linear(x, kernel, bias)

    def _split_heads(self, x, depth):
        """[batch, length, h*depth] -> [batch, h, length, depth]."""
        batch, length = tf.shape(x)[0], tf.shape(x)[1]
        x = tf.reshape(x, [batch, length, self.num_heads, depth])
        return tf.transpose(x, [0, 2, 1, 3])

    def _project_self(self, x):
        qkv = self._dense(x, self.qkv_kernel, self.qkv_bias)
        hk = self.num_heads * self.d_k
        q, k, v = tf.split(qkv, [hk, hk, self.num_heads * self.d_v], axis=-1)
        return (self._split_heads(q, self.d_k), self._split_heads(k, self.d_k),
                self._split_heads(v, self.d_v))

    def project_memory(self, memory):
        """Encoder memory [batch, S, d_model] -> keys [b, h, S, d_k], values [b, h, S, d_v]."""
        kv = self._dense(memory, self.key_value_kernel, self.key_value_bias)
        k, v = tf.split(kv, [self.num_heads * self.d_k, self.num_heads * self.d_v], axis=-1)
        return self._split_heads(k, self.d_k), self._split_heads(v, self.d_v)

    # -- attention --------------------------------------------------------
    def attention_weights(self, q, k, bias):
        """softmax(Q K^T / sqrt(d_k) + bias) in float32: [batch, h, T, S]."""
        q = q * tf.cast(self.d_k ** -0.5, q.dtype)
        logits = tf.matmul(q, k, transpose_b=True)
        return tf.nn.softmax(tf.cast(logits, tf.float32) + tf.cast(bias, tf.float32))

    def _attend(self, q, k, v, bias, training):
        weights = self.weights_dropout(self.attention_weights(q, k, bias), training=training)
        heads = tf.matmul(tf.cast(weights, v.dtype), v)  # [batch, h, T, d_v]
        batch, length = tf.shape(heads)[0], tf.shape(heads)[2]
        heads = tf.reshape(tf.transpose(heads, [0, 2, 1, 3]),
                           [batch, length, self.num_heads * self.d_v])
        return self._dense(heads, self.output_kernel, self.output_bias)

    def call(self, query, memory=None, bias=None, training=None):
        """Full pass. query [batch, T, d_model]; memory [batch, S, d_model] for cross attention."""
        if self.self_attention:
            q, k, v = self._project_self(query)
        else:
            q = self._split_heads(self._dense(query, self.query_kernel, self.query_bias), self.d_k)
            k, v = self.project_memory(memory)
        return self._attend(q, k, v, 0.0 if bias is None else bias, training)

    def call_self_cached(self, query, cache, step, bias):
        """One decoding step of self-attention with a key/value cache.

        Args:
          query: [batch, 1, d_model], the newest position only.
          cache: {"k": [batch, h, L, d_k], "v": [batch, h, L, d_v]}.
          step: int32 scalar, the position of `query`.
          bias: None for a growing cache (L == step: the new key/value is
            appended, every cached position is visible); else [1, 1, 1, L], the
            additive float32 bias of a fixed-shape cache (masks.step_mask): the
            key/value is written at index `step`, later keys are masked.
        Returns:
          (output [batch, 1, d_model], updated cache).
        """
        q, k, v = self._project_self(query)
        k, v = tf.cast(k, cache["k"].dtype), tf.cast(v, cache["v"].dtype)
        if bias is None:
            cache = {"k": tf.concat([cache["k"], k], axis=2), "v": tf.concat([cache["v"], v], axis=2)}
            bias = 0.0
        else:  # a scatter into column `step`: in place under XLA, where a select copies
            rows, heads = tf.meshgrid(tf.range(tf.shape(k)[0]), tf.range(self.num_heads),
                                      indexing="ij")
            index = tf.stack([rows, heads, tf.fill(tf.shape(rows), step)], axis=-1)
            cache = {"k": tf.tensor_scatter_nd_update(cache["k"], index, k[:, :, 0]),
                     "v": tf.tensor_scatter_nd_update(cache["v"], index, v[:, :, 0])}
        return self._attend(q, cache["k"], cache["v"], bias, training=False), cache

    def call_cross_cached(self, query, memory_k, memory_v, bias):
        """Cross attention of one step against memory projected once by `project_memory`."""
        q = self._split_heads(self._dense(query, self.query_kernel, self.query_bias), self.d_k)
        return self._attend(q, memory_k, memory_v, bias, training=False)

    def get_config(self):
        config = super().get_config()
        config.update(d_model=self.d_model, num_heads=self.num_heads, d_k=self.d_k,
                      d_v=self.d_v, attention_dropout=self.attention_dropout,
                      self_attention=self.self_attention)
        return config
