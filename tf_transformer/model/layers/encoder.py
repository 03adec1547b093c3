"""The encoder stack (section 3.1): N identical layers of self-attention and FFN."""

import keras

from tf_transformer.model import kernels as kernels_lib
from tf_transformer.model.layers.attention import SelfAttention
from tf_transformer.model.layers.stack import LayerStack, TransformerLayer


@keras.saving.register_keras_serializable(package="tf_transformer")
class EncoderLayer(TransformerLayer):
    """One encoder layer; each sub-layer is LayerNorm(x + Dropout(Sublayer(x))).

    With `pre_norm` the normalisation moves in front: x + Dropout(Sublayer(LayerNorm(x))).
    """

    SUBLAYERS = ("self_attention", "feed_forward")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.add_sublayer("self_attention", self.attention_layer(SelfAttention, "self_attention"))
        self.add_sublayer("feed_forward", self.feed_forward_layer())

    def call(self, x, bias, training=None, kernels: kernels_lib.Kernels = kernels_lib.TRAINING,
             dropout_key=None):
        """x [batch, S, d_model]; bias: padding bias [batch, 1, 1, S]; dropout_key: int64
        scalar that picks every dropout mask (layers/dropout.py), or None."""
        x = self.sublayer(
            "self_attention", x,
            lambda y: self.self_attention(y, bias, training=training, kernels=kernels,
                                          dropout_key=dropout_key), training, dropout_key)
        return self.sublayer(
            "feed_forward", x,
            lambda y: self.feed_forward(y, kernels=kernels, training=training,
                                        dropout_key=dropout_key), training, dropout_key)


@keras.saving.register_keras_serializable(package="tf_transformer")
class Encoder(LayerStack):
    """N encoder layers; with pre_norm a final LayerNorm (post-norm needs none)."""

    layer_class = EncoderLayer

    def call(self, x, bias, training=None, kernels: kernels_lib.Kernels = kernels_lib.TRAINING,
             dropout_key=None):
        """[batch, S, d_model] embedded source -> memory [batch, S, d_model]."""
        for layer in self.layers:
            x = layer(x, bias, training=training, kernels=kernels, dropout_key=dropout_key)
        return self.normalize_output(x, training)
