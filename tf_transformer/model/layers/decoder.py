"""The decoder stack (section 3.1): masked self-attention, encoder-decoder attention, FFN.

Besides the full (teacher-forced) pass, each layer runs one decoding step
against a fixed-shape key/value cache; `tests/test_model.py` checks that both
give the same logits.
"""

import keras

from tf_transformer.model.layers.attention import MultiHeadAttention
from tf_transformer.model.layers.feed_forward import FeedForward
from tf_transformer.model.layers.stack import LayerStack


@keras.saving.register_keras_serializable(package="tf_transformer")
class DecoderLayer(keras.layers.Layer):
    """One decoder layer; each sub-layer is LayerNorm(x + Dropout(Sublayer(x)))."""

    def __init__(self, d_model, num_heads, d_k, d_v, d_ff, dropout, attention_dropout=0.0,
                 pre_norm=False, layer_norm_epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.num_heads, self.d_k, self.d_v, self.d_ff = d_model, num_heads, d_k, d_v, d_ff
        self.dropout, self.attention_dropout = dropout, attention_dropout
        self.pre_norm, self.layer_norm_epsilon = pre_norm, layer_norm_epsilon
        policy = self.dtype_policy

        def norm(name):
            return keras.layers.LayerNormalization(epsilon=layer_norm_epsilon, name=name, dtype=policy)

        self.self_attention = MultiHeadAttention(
            d_model, num_heads, d_k, d_v, attention_dropout, self_attention=True,
            name="self_attention", dtype=policy)
        self.self_attention_dropout = keras.layers.Dropout(dropout, dtype=policy)
        self.self_attention_norm = norm("self_attention_norm")
        self.cross_attention = MultiHeadAttention(
            d_model, num_heads, d_k, d_v, attention_dropout, self_attention=False,
            name="cross_attention", dtype=policy)
        self.cross_attention_dropout = keras.layers.Dropout(dropout, dtype=policy)
        self.cross_attention_norm = norm("cross_attention_norm")
        self.feed_forward = FeedForward(d_model, d_ff, name="feed_forward", dtype=policy)
        self.feed_forward_dropout = keras.layers.Dropout(dropout, dtype=policy)
        self.feed_forward_norm = norm("feed_forward_norm")

    def build(self, input_shape=None):
        shape = (None, None, self.d_model)
        for layer in (self.self_attention, self.cross_attention, self.feed_forward,
                      self.self_attention_norm, self.cross_attention_norm, self.feed_forward_norm):
            layer.build(shape)
        self.built = True

    def _residual(self, x, sublayer, dropout, norm, training):
        """The paper's LayerNorm(x + Dropout(Sublayer(x))), or its pre-norm variant."""
        if self.pre_norm:
            return x + dropout(sublayer(norm(x)), training=training)
        return norm(x + dropout(sublayer(x), training=training))

    def call(self, x, memory, self_bias, memory_bias, training=None):
        """Teacher-forced pass.

        Args:
          x: [batch, T, d_model] embedded target (shifted right).
          memory: [batch, S, d_model] encoder output.
          self_bias: [batch, 1, T, T] causal and padding bias.
          memory_bias: [batch, 1, 1, S] source padding bias.
        """
        x = self._residual(
            x, lambda y: self.self_attention(y, bias=self_bias, training=training),
            self.self_attention_dropout, self.self_attention_norm, training)
        x = self._residual(
            x, lambda y: self.cross_attention(y, memory, bias=memory_bias, training=training),
            self.cross_attention_dropout, self.cross_attention_norm, training)
        return self._residual(x, self.feed_forward, self.feed_forward_dropout,
                              self.feed_forward_norm, training)

    def call_step(self, x, step, self_cache, memory_k, memory_v, step_bias, memory_bias):
        """One decoding step (inference only: no dropout).

        Args:
          x: [batch, 1, d_model] the newest position.
          step: int32 scalar position of x.
          self_cache: {"k": [batch, h, L, d_k], "v": [batch, h, L, d_v]}.
          memory_k, memory_v: this layer's projected memory [batch, h, S, d_k|d_v].
          step_bias: [1, 1, 1, L] for a fixed-shape cache, None for a growing one;
            memory_bias: [batch, 1, 1, S].
        Returns:
          (y [batch, 1, d_model], updated self_cache).
        """
        new_cache = {}

        def self_attend(y):
            out, cache = self.self_attention.call_self_cached(y, self_cache, step, step_bias)
            new_cache.update(cache)
            return out

        x = self._residual(x, self_attend, self.self_attention_dropout,
                           self.self_attention_norm, False)
        x = self._residual(
            x, lambda y: self.cross_attention.call_cross_cached(y, memory_k, memory_v, memory_bias),
            self.cross_attention_dropout, self.cross_attention_norm, False)
        x = self._residual(x, self.feed_forward, self.feed_forward_dropout,
                           self.feed_forward_norm, False)
        return x, new_cache

    def get_config(self):
        config = super().get_config()
        config.update(d_model=self.d_model, num_heads=self.num_heads, d_k=self.d_k,
                      d_v=self.d_v, d_ff=self.d_ff, dropout=self.dropout,
                      attention_dropout=self.attention_dropout, pre_norm=self.pre_norm,
                      layer_norm_epsilon=self.layer_norm_epsilon)
        return config


@keras.saving.register_keras_serializable(package="tf_transformer")
class Decoder(LayerStack):
    """N decoder layers; with pre_norm a final LayerNorm (post-norm needs none)."""

    layer_class = DecoderLayer

    def call(self, x, memory, self_bias, memory_bias, training=None):
        """[batch, T, d_model] embedded target -> [batch, T, d_model]."""
        for layer in self.layers:
            x = layer(x, memory, self_bias, memory_bias, training=training)
        return self.normalize_output(x)

    def call_step(self, x, step, cache, step_bias, memory_bias):
        """x [batch, 1, d_model] -> (y [batch, 1, d_model], new per-layer self caches).

        `cache` is the model's decoding cache: cache["self"][i] and
        cache["memory"][i] hold layer i's self-attention cache and projected memory.
        """
        new_self = []
        for i, layer in enumerate(self.layers):
            memory = cache["memory"]["layers"][i]
            x, layer_cache = layer.call_step(x, step, cache["self"][i], memory["k"], memory["v"],
                                             step_bias, memory_bias)
            new_self.append(layer_cache)
        return self.normalize_output(x), new_self
