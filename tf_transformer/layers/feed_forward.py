"""Position-wise feed-forward network (section 3.3)."""

import keras


@keras.saving.register_keras_serializable(package="tf_transformer")
class FeedForward(keras.layers.Layer):
    """FFN(x) = max(0, x W1 + b1) W2 + b2, applied to each position alike.

    The paper has no dropout inside the FFN (only on the sub-layer output,
    which the encoder/decoder layer applies), so none is added here.
    """

    def __init__(self, d_model, d_ff, **kwargs):
        super().__init__(**kwargs)
        self.d_model = d_model
        self.d_ff = d_ff
        self.inner = keras.layers.Dense(d_ff, activation="relu", name="inner",
                                        dtype=self.dtype_policy)
        self.outer = keras.layers.Dense(d_model, name="outer", dtype=self.dtype_policy)

    def build(self, input_shape=None):
        self.inner.build((None, None, self.d_model))
        self.outer.build((None, None, self.d_ff))
        self.built = True

    def call(self, x):
        """[batch, length, d_model] -> [batch, length, d_model]."""
        return self.outer(self.inner(x))

    def get_config(self):
        config = super().get_config()
        config.update(d_model=self.d_model, d_ff=self.d_ff)
        return config
