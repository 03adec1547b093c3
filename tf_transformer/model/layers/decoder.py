"""The decoder stack (section 3.1): masked self-attention, encoder-decoder attention, FFN.

Besides the full (teacher-forced) pass, each layer runs one decoding step
against the model's DecoderCache (model/cache.py, growing or fixed alike);
tests/model/test_cache.py checks that both give the full pass's logits.
"""

import keras

from tf_transformer.model import kernels as kernels_lib
from tf_transformer.model.cache import DecoderCache
from tf_transformer.model.layers.attention import CrossAttention, SelfAttention
from tf_transformer.model.layers.stack import LayerStack, TransformerLayer


@keras.saving.register_keras_serializable(package="tf_transformer")
class DecoderLayer(TransformerLayer):
    """One decoder layer; each sub-layer is LayerNorm(x + Dropout(Sublayer(x)))."""

    SUBLAYERS = ("self_attention", "cross_attention", "feed_forward")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.add_sublayer("self_attention", self.attention_layer(SelfAttention, "self_attention"))
        self.add_sublayer("cross_attention",
                          self.attention_layer(CrossAttention, "cross_attention"))
        self.add_sublayer("feed_forward", self.feed_forward_layer())

    def call(self, x, memory, self_bias, memory_bias, training=None, dropout_key=None):
        """Teacher-forced pass.

        Args:
          x: [batch, T, d_model] embedded target (shifted right).
          memory: [batch, S, d_model] encoder output.
          self_bias: [batch, 1, T, T] causal and padding bias.
          memory_bias: [batch, 1, 1, S] source padding bias.
          dropout_key: int64 scalar that picks every dropout mask (layers/dropout.py), or None.
        """
        x = self.sublayer(
            "self_attention", x,
            lambda y: self.self_attention(y, self_bias, training=training,
                                          dropout_key=dropout_key), training, dropout_key)
        x = self.sublayer(
            "cross_attention", x,
            lambda y: self.cross_attention(y, memory, memory_bias, training=training,
                                           dropout_key=dropout_key), training, dropout_key)
        return self.sublayer(
            "feed_forward", x,
            lambda y: self.feed_forward(y, training=training, dropout_key=dropout_key),
            training, dropout_key)

    def step(self, x, step, self_cache, memory_keys, memory_values, memory_bias,
             kernels: kernels_lib.Kernels = kernels_lib.STEP, with_attention: bool = False):
        """One decoding step (inference only: no dropout).

        Args:
          x: [batch, 1, d_model] the newest position.
          step: int32 scalar position of x.
          self_cache: this layer's SelfAttentionCache (model/cache.py).
          memory_keys, memory_values: this layer's projected memory [batch, h, S, d_k|d_v].
          memory_bias: [batch, 1, 1, S].
          kernels: the step's kernel policy (model/kernels.py).
          with_attention: also return the cross-attention weights averaged over heads.
        Returns:
          (y [batch, 1, d_model], updated self_cache), and with `with_attention` the
          cross-attention float32 [batch, S] third.
        """
        caches, attention = [], []

        def self_attend(y):
            out, cache = self.self_attention.step(y, self_cache, step, kernels)
            caches.append(cache)
            return out

        def cross_attend(y):
            out = self.cross_attention.step(y, memory_keys, memory_values, memory_bias,
                                            kernels, return_weights=with_attention)
            if not with_attention:
                return out
            attention.append(out[1][:, 0])
            return out[0]

        x = self.sublayer("self_attention", x, self_attend, False)
        x = self.sublayer("cross_attention", x, cross_attend, False)
        x = self.sublayer("feed_forward", x, lambda y: self.feed_forward(y, kernels=kernels),
                          False)
        return (x, caches[0], attention[0]) if with_attention else (x, caches[0])


@keras.saving.register_keras_serializable(package="tf_transformer")
class Decoder(LayerStack):
    """N decoder layers; with pre_norm a final LayerNorm (post-norm needs none)."""

    layer_class = DecoderLayer

    def call(self, x, memory, self_bias, memory_bias, training=None, dropout_key=None):
        """[batch, T, d_model] embedded target -> [batch, T, d_model]."""
        for layer in self.layers:
            x = layer(x, memory, self_bias, memory_bias, training=training,
                      dropout_key=dropout_key)
        return self.normalize_output(x, training)

    def step(self, x, step, cache: DecoderCache,
             kernels: kernels_lib.Kernels = kernels_lib.STEP, with_attention: bool = False):
        """x [batch, 1, d_model] at position `step` -> (y [batch, 1, d_model], the
        tuple of updated self-attention caches, one per layer), and with
        `with_attention` the last layer's cross-attention averaged over heads,
        float32 [batch, S], third."""
        new_self = []
        for i, layer in enumerate(self.layers):
            last = with_attention and i == self.num_layers - 1
            out = layer.step(x, step, cache.self_attention[i], cache.memory_keys[i],
                             cache.memory_values[i], cache.memory_bias, kernels, last)
            x, layer_cache = out[:2]
            new_self.append(layer_cache)
        if with_attention:
            return self.normalize_output(x), tuple(new_self), out[2]
        return self.normalize_output(x), tuple(new_self)
