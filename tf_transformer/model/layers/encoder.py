"""The encoder stack (section 3.1): N identical layers of self-attention and FFN."""

import keras

from tf_transformer.model.layers.attention import SelfAttention
from tf_transformer.model.layers.feed_forward import FeedForward
from tf_transformer.model.layers.stack import LayerStack


def _norm(epsilon, name, dtype_policy):
    return keras.layers.LayerNormalization(epsilon=epsilon, name=name, dtype=dtype_policy)


@keras.saving.register_keras_serializable(package="tf_transformer")
class EncoderLayer(keras.layers.Layer):
    """One encoder layer; each sub-layer is LayerNorm(x + Dropout(Sublayer(x))).

    With `pre_norm` the normalisation moves in front: x + Dropout(Sublayer(LayerNorm(x))).
    """

    def __init__(self, d_model, num_heads, d_k, d_v, d_ff, dropout, attention_dropout=0.0,
                 pre_norm=False, layer_norm_epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.num_heads, self.d_k, self.d_v, self.d_ff = d_model, num_heads, d_k, d_v, d_ff
        self.dropout, self.attention_dropout = dropout, attention_dropout
        self.pre_norm, self.layer_norm_epsilon = pre_norm, layer_norm_epsilon
        policy = self.dtype_policy
        self.self_attention = SelfAttention(d_model, num_heads, d_k, d_v, attention_dropout,
                                            name="self_attention", dtype=policy)
        self.self_attention_dropout = keras.layers.Dropout(dropout, dtype=policy)
        self.self_attention_norm = _norm(layer_norm_epsilon, "self_attention_norm", policy)
        self.feed_forward = FeedForward(d_model, d_ff, name="feed_forward", dtype=policy)
        self.feed_forward_dropout = keras.layers.Dropout(dropout, dtype=policy)
        self.feed_forward_norm = _norm(layer_norm_epsilon, "feed_forward_norm", policy)

    def build(self, input_shape=None):
        shape = (None, None, self.d_model)
        for layer in (self.self_attention, self.feed_forward, self.self_attention_norm,
                      self.feed_forward_norm):
            layer.build(shape)
        self.built = True

    def call(self, x, bias, training=None):
        """x [batch, S, d_model]; bias: padding bias [batch, 1, 1, S]."""
        if self.pre_norm:
            x = x + self.self_attention_dropout(
                self.self_attention(self.self_attention_norm(x), bias, training=training),
                training=training)
            return x + self.feed_forward_dropout(
                self.feed_forward(self.feed_forward_norm(x)), training=training)
        x = self.self_attention_norm(x + self.self_attention_dropout(
            self.self_attention(x, bias, training=training), training=training))
        return self.feed_forward_norm(x + self.feed_forward_dropout(
            self.feed_forward(x), training=training))

    def get_config(self):
        config = super().get_config()
        config.update(d_model=self.d_model, num_heads=self.num_heads, d_k=self.d_k,
                      d_v=self.d_v, d_ff=self.d_ff, dropout=self.dropout,
                      attention_dropout=self.attention_dropout, pre_norm=self.pre_norm,
                      layer_norm_epsilon=self.layer_norm_epsilon)
        return config


@keras.saving.register_keras_serializable(package="tf_transformer")
class Encoder(LayerStack):
    """N encoder layers; with pre_norm a final LayerNorm (post-norm needs none)."""

    layer_class = EncoderLayer

    def call(self, x, bias, training=None):
        """[batch, S, d_model] embedded source -> memory [batch, S, d_model]."""
        for layer in self.layers:
            x = layer(x, bias, training=training)
        return self.normalize_output(x)
