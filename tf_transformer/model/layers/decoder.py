"""The decoder stack (section 3.1): masked self-attention, encoder-decoder attention, FFN.

Besides the full (teacher-forced) pass, each layer runs one decoding step
against the model's DecoderCache (model/cache.py, growing or fixed alike);
tests/model/test_cache.py checks that both give the full pass's logits.
"""

import keras

from tf_transformer.model.cache import DecoderCache
from tf_transformer.model.layers.attention import CrossAttention, SelfAttention
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

        self.self_attention = SelfAttention(d_model, num_heads, d_k, d_v, attention_dropout,
                                            name="self_attention", dtype=policy)
        self.self_attention_dropout = keras.layers.Dropout(dropout, dtype=policy)
        self.self_attention_norm = norm("self_attention_norm")
        self.cross_attention = CrossAttention(d_model, num_heads, d_k, d_v, attention_dropout,
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
            x, lambda y: self.self_attention(y, self_bias, training=training),
            self.self_attention_dropout, self.self_attention_norm, training)
        x = self._residual(
            x, lambda y: self.cross_attention(y, memory, memory_bias, training=training),
            self.cross_attention_dropout, self.cross_attention_norm, training)
        return self._residual(x, self.feed_forward, self.feed_forward_dropout,
                              self.feed_forward_norm, training)

    def step(self, x, step, self_cache, memory_keys, memory_values, memory_bias):
        """One decoding step (inference only: no dropout).

        Args:
          x: [batch, 1, d_model] the newest position.
          step: int32 scalar position of x.
          self_cache: this layer's SelfAttentionCache (model/cache.py).
          memory_keys, memory_values: this layer's projected memory [batch, h, S, d_k|d_v].
          memory_bias: [batch, 1, 1, S].
        Returns:
          (y [batch, 1, d_model], updated self_cache).
        """
        caches = []

        def self_attend(y):
            out, cache = self.self_attention.step(y, self_cache, step)
            caches.append(cache)
            return out

        x = self._residual(x, self_attend, self.self_attention_dropout,
                           self.self_attention_norm, False)
        x = self._residual(
            x, lambda y: self.cross_attention.step(y, memory_keys, memory_values, memory_bias),
            self.cross_attention_dropout, self.cross_attention_norm, False)
        x = self._residual(x, self.feed_forward, self.feed_forward_dropout,
                           self.feed_forward_norm, False)
        return x, caches[0]

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

    def step(self, x, step, cache: DecoderCache):
        """x [batch, 1, d_model] at position `step` -> (y [batch, 1, d_model], the
        tuple of updated self-attention caches, one per layer)."""
        new_self = []
        for i, layer in enumerate(self.layers):
            x, layer_cache = layer.step(x, step, cache.self_attention[i], cache.memory_keys[i],
                                        cache.memory_values[i], cache.memory_bias)
            new_self.append(layer_cache)
        return self.normalize_output(x), tuple(new_self)
