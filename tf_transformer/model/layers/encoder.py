"""The encoder stack (section 3.1): N identical layers of self-attention and FFN."""

import keras

from tf_transformer.model.layers.attention import SelfAttention
from tf_transformer.model.layers.feed_forward import FeedForward
from tf_transformer.model.layers.stack import LayerStack, TransformerLayer


@keras.saving.register_keras_serializable(package="tf_transformer")
class EncoderLayer(TransformerLayer):
    """One encoder layer; each sub-layer is LayerNorm(x + Dropout(Sublayer(x))).

    With `pre_norm` the normalisation moves in front: x + Dropout(Sublayer(LayerNorm(x))).
    """

    def create_sublayers(self):
        self.add_sublayer("self_attention", SelfAttention(
            self.d_model, self.num_heads, self.d_k, self.d_v, self.attention_dropout,
            name="self_attention", dtype=self.dtype_policy))
        self.add_sublayer("feed_forward", FeedForward(
            self.d_model, self.d_ff, name="feed_forward", dtype=self.dtype_policy))

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


@keras.saving.register_keras_serializable(package="tf_transformer")
class Encoder(LayerStack):
    """N encoder layers; with pre_norm a final LayerNorm (post-norm needs none)."""

    layer_class = EncoderLayer

    def call(self, x, bias, training=None):
        """[batch, S, d_model] embedded source -> memory [batch, S, d_model]."""
        for layer in self.layers:
            x = layer(x, bias, training=training)
        return self.normalize_output(x)
