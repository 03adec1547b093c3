"""Position-wise feed-forward network (section 3.3)."""

import keras
import tensorflow as tf

from tf_transformer.model import kernels as kernels_lib
from tf_transformer.model.layers.dropout import Dropout
from tf_transformer.model.layers.linear import linear


@keras.saving.register_keras_serializable(package="tf_transformer")
class FeedForward(keras.layers.Layer):
    """FFN(x) = max(0, x W1 + b1) W2 + b2, applied to each position alike.

    The paper has no dropout inside the FFN (only on the sub-layer output,
    which the encoder/decoder layer applies): `relu_dropout` is 0 by default. Above
    0, the hidden activations are dropped after the ReLU in training,
    W2 Dropout(max(0, x W1 + b1)), as fairseq's `activation_dropout` and
    OpenNMT-tf's `ffn_dropout` do (a regulariser for small corpora). Weights are
    our own rather than keras.layers.Dense so that both products run as 2-D GEMMs
    (layers/linear.py).
    """

    def __init__(self, d_model, d_ff, relu_dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        self.d_model = d_model
        self.d_ff = d_ff
        self.relu_dropout = relu_dropout
        self.hidden_dropout = Dropout(relu_dropout, name="relu_dropout", dtype=self.dtype_policy)

    def build(self, input_shape=None):
        glorot = keras.initializers.GlorotUniform
        self.inner_kernel = self.add_weight(name="inner_kernel", shape=(self.d_model, self.d_ff),
                                            initializer=glorot())
        self.inner_bias = self.add_weight(name="inner_bias", shape=(self.d_ff,), initializer="zeros")
        self.outer_kernel = self.add_weight(name="outer_kernel", shape=(self.d_ff, self.d_model),
                                            initializer=glorot())
        self.outer_bias = self.add_weight(name="outer_bias", shape=(self.d_model,),
                                          initializer="zeros")
        self.built = True

    def call(self, x, kernels: kernels_lib.Kernels = kernels_lib.TRAINING, training=None,
             dropout_key=None):
        """[batch, length, d_model] -> [batch, length, d_model]; `dropout_key` picks the
        ReLU dropout's mask (layers/dropout.py)."""
        hidden = linear(x, self.inner_kernel, self.inner_bias, activation=tf.nn.relu,
                        kernels=kernels)
        hidden = self.hidden_dropout(hidden, training=training, dropout_key=dropout_key)
        return linear(hidden, self.outer_kernel, self.outer_bias, kernels=kernels)

    def get_config(self):
        config = super().get_config()
        config.update(d_model=self.d_model, d_ff=self.d_ff, relu_dropout=self.relu_dropout)
        return config
