"""N identical layers with the paper's shared arguments: the frame of both stacks."""

import keras


class LayerStack(keras.layers.Layer):
    """Holds `layer_0 .. layer_{N-1}` of `layer_class` and, with pre_norm, a final LayerNorm.

    Layers are named attributes rather than a list because tf.train.Checkpoint
    tracks attributes, not Python lists. Post-norm needs no final LayerNorm
    (each sub-layer already ends in one).
    """

    layer_class: type = None

    def __init__(self, num_layers, d_model, num_heads, d_k, d_v, d_ff, dropout,
                 attention_dropout=0.0, pre_norm=False, layer_norm_epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self.num_layers = num_layers
        self.layer_args = dict(d_model=d_model, num_heads=num_heads, d_k=d_k, d_v=d_v, d_ff=d_ff,
                               dropout=dropout, attention_dropout=attention_dropout,
                               pre_norm=pre_norm, layer_norm_epsilon=layer_norm_epsilon)
        for i in range(num_layers):
            setattr(self, f"layer_{i}", self.layer_class(
                **self.layer_args, name=f"layer_{i}", dtype=self.dtype_policy))
        self.final_norm = (keras.layers.LayerNormalization(
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

    def normalize_output(self, x):
        return x if self.final_norm is None else self.final_norm(x)

    def get_config(self):
        config = super().get_config()
        config.update(num_layers=self.num_layers, **self.layer_args)
        return config
