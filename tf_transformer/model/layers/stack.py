"""The frame shared by encoder and decoder: one layer's arguments, its sub-layer residual,
and N such layers as a stack."""

import keras

from tf_transformer.model.layers.dropout import Dropout
from tf_transformer.model.layers.feed_forward import FeedForward
from tf_transformer.model.layers.layer_norm import LayerNormalization


class TransformerLayer(keras.layers.Layer):
    """Arguments and residual shared by EncoderLayer and DecoderLayer.

    Each subclass adds its sub-layers in the paper's order (`add_sublayer`: the
    sub-layer, its dropout (P_drop on its output) and its LayerNorm) and lists
    their names in SUBLAYERS; `build` builds them in that order, then their
    LayerNorms (build order fixes which seeded initial values each weight gets).
    """

    SUBLAYERS: tuple = ()

    def __init__(self, d_model, num_heads, d_k, d_v, d_ff, dropout, attention_dropout=0.0,
                 pre_norm=False, layer_norm_epsilon=1e-6, relu_dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.num_heads, self.d_k, self.d_v, self.d_ff = d_model, num_heads, d_k, d_v, d_ff
        self.dropout, self.attention_dropout = dropout, attention_dropout
        self.relu_dropout = relu_dropout
        self.pre_norm, self.layer_norm_epsilon = pre_norm, layer_norm_epsilon

    def add_sublayer(self, name: str, layer: keras.layers.Layer) -> None:
        """Sets `name` to `layer`, `{name}_dropout` to P_drop on its output (section 5.4)
        and `{name}_norm` to its LayerNorm, in that order (the checkpoint's names)."""
        setattr(self, name, layer)
        setattr(self, f"{name}_dropout", Dropout(self.dropout, dtype=self.dtype_policy))
        setattr(self, f"{name}_norm", LayerNormalization(
            epsilon=self.layer_norm_epsilon, name=f"{name}_norm", dtype=self.dtype_policy))

    def attention_layer(self, layer_class: type, name: str) -> keras.layers.Layer:
        """A SelfAttention or CrossAttention of this layer's widths."""
        return layer_class(self.d_model, self.num_heads, self.d_k, self.d_v,
                           self.attention_dropout, name=name, dtype=self.dtype_policy)

    def feed_forward_layer(self) -> FeedForward:
        return FeedForward(self.d_model, self.d_ff, self.relu_dropout, name="feed_forward",
                           dtype=self.dtype_policy)

    def sublayer(self, name: str, x, function, training, dropout_key=None):
        """The residual around sub-layer `name` (`residual`), `function` computing it."""
        return self.residual(x, function, getattr(self, f"{name}_dropout"),
                             getattr(self, f"{name}_norm"), training, dropout_key)

    def build(self, input_shape=None):
        names = self.SUBLAYERS
        for name in names + tuple(f"{n}_norm" for n in names):
            getattr(self, name).build((None, None, self.d_model))
        self.built = True

    def residual(self, x, sublayer, dropout, norm, training, dropout_key=None):
        """The paper's LayerNorm(x + Dropout(Sublayer(x))), or its pre-norm variant
        x + Dropout(Sublayer(LayerNorm(x))); `dropout_key` picks the mask (layers/dropout.py)."""
        if self.pre_norm:
            return x + dropout(sublayer(norm(x, training=training)), training=training,
                               dropout_key=dropout_key)
        return norm(x + dropout(sublayer(x), training=training, dropout_key=dropout_key),
                    training=training)

    def get_config(self):
        config = super().get_config()
        config.update(d_model=self.d_model, num_heads=self.num_heads, d_k=self.d_k,
                      d_v=self.d_v, d_ff=self.d_ff, dropout=self.dropout,
                      attention_dropout=self.attention_dropout, pre_norm=self.pre_norm,
                      layer_norm_epsilon=self.layer_norm_epsilon, relu_dropout=self.relu_dropout)
        return config


class LayerStack(keras.layers.Layer):
    """Holds `layer_0 .. layer_{N-1}` of `layer_class` and, with pre_norm, a final LayerNorm.

    Layers are named attributes rather than a list because tf.train.Checkpoint
    tracks attributes, not Python lists. Post-norm needs no final LayerNorm
    (each sub-layer already ends in one).
    """

    layer_class: type = None

    def __init__(self, num_layers, d_model, num_heads, d_k, d_v, d_ff, dropout,
                 attention_dropout=0.0, pre_norm=False, layer_norm_epsilon=1e-6,
                 relu_dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        self.num_layers = num_layers
        self.layer_args = dict(d_model=d_model, num_heads=num_heads, d_k=d_k, d_v=d_v, d_ff=d_ff,
                               dropout=dropout, attention_dropout=attention_dropout,
                               pre_norm=pre_norm, layer_norm_epsilon=layer_norm_epsilon,
                               relu_dropout=relu_dropout)
        for i in range(num_layers):
            setattr(self, f"layer_{i}", self.layer_class(
                **self.layer_args, name=f"layer_{i}", dtype=self.dtype_policy))
        self.final_norm = (LayerNormalization(
            epsilon=layer_norm_epsilon, name="final_norm", dtype=self.dtype_policy)
            if pre_norm else None)

    @property
    def layers(self) -> list:
        return [getattr(self, f"layer_{i}") for i in range(self.num_layers)]

    def build(self, input_shape=None):
        for layer in self.layers:
            layer.build()
        if self.final_norm is not None:
            self.final_norm.build((None, None, self.layer_args["d_model"]))
        self.built = True

    def normalize_output(self, x, training=None):
        return x if self.final_norm is None else self.final_norm(x, training=training)

    def get_config(self):
        config = super().get_config()
        config.update(num_layers=self.num_layers, **self.layer_args)
        return config
