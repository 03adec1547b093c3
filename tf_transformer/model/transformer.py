"""The Transformer (section 3): encoder-decoder with a shared embedding.

Four entry points, each with one return type:
  call(inputs)                       -> float32 logits [batch, T, vocab] (training)
  encode(source)                     -> memory [batch, S, d_model]
  initial_cache(memory, source, L)   -> decoding cache for L steps
  decode_step(ids, step, cache)      -> (float32 logits [batch, vocab], cache)
`decode_step` is the `symbols_to_logits_fn` contract of beam_search.py.
"""

import dataclasses

import keras
import tensorflow as tf

from tf_transformer.config import ModelConfig
from tf_transformer.model import masks
from tf_transformer.model.layers import Decoder, Encoder, TokenAndPositionEmbedding

# Cache entries the same for every beam of a sentence: beam search tiles them
# but never reorders them.
FIXED_CACHE_KEYS = ("memory",)


@keras.saving.register_keras_serializable(package="tf_transformer")
class Transformer(keras.Model):
    """Encoder-decoder Transformer; arguments are ModelConfig's fields."""

    def __init__(self, vocab_size, num_layers, d_model, d_ff, num_heads, d_k, d_v, dropout,
                 attention_dropout=0.0, positions="sinusoid", max_positions=1024,
                 share_embeddings=True, source_vocab_size=0, pre_norm=False,
                 layer_norm_epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size, self.num_layers, self.d_model, self.d_ff = vocab_size, num_layers, d_model, d_ff
        self.num_heads, self.d_k, self.d_v = num_heads, d_k, d_v
        self.dropout, self.attention_dropout = dropout, attention_dropout
        self.positions, self.max_positions = positions, max_positions
        self.share_embeddings, self.source_vocab_size = share_embeddings, source_vocab_size
        self.pre_norm, self.layer_norm_epsilon = pre_norm, layer_norm_epsilon
        policy = self.dtype_policy

        def embedding(vocab, name):
            return TokenAndPositionEmbedding(vocab, d_model, positions, max_positions, dropout,
                                             name=name, dtype=policy)

        self.target_embedding = embedding(vocab_size, "embedding")
        self.source_embedding = (self.target_embedding if share_embeddings
                                 else embedding(source_vocab_size or vocab_size, "source_embedding"))
        stack_args = dict(num_layers=num_layers, d_model=d_model, num_heads=num_heads, d_k=d_k,
                          d_v=d_v, d_ff=d_ff, dropout=dropout, attention_dropout=attention_dropout,
                          pre_norm=pre_norm, layer_norm_epsilon=layer_norm_epsilon, dtype=policy)
        self.encoder = Encoder(name="encoder", **stack_args)
        self.decoder = Decoder(name="decoder", **stack_args)

    def build(self, input_shape=None):
        for layer in {id(l): l for l in (self.source_embedding, self.target_embedding)}.values():
            layer.build()
        self.encoder.build()
        self.decoder.build()
        self.built = True

    def get_build_config(self):
        return {"built_from_arguments": True}  # non-empty, so loading calls build_from_config

    def build_from_config(self, config):
        self.build()

    # -- training pass -----------------------------------------------------
    def encode(self, source, training=None):
        """[batch, S] source ids -> memory [batch, S, d_model] (pad positions masked out)."""
        bias = masks.attention_bias(masks.padding_mask(source))
        return self.encoder(self.source_embedding(source, training=training), bias, training=training)

    def decode_states(self, target_in, memory, source, training=None):
        """Teacher-forced decoder output before the softmax layer: [batch, T, d_model]."""
        self_bias = masks.attention_bias(masks.decoder_self_mask(target_in))
        memory_bias = masks.attention_bias(masks.padding_mask(source))
        x = self.target_embedding(target_in, training=training)
        return self.decoder(x, memory, self_bias, memory_bias, training=training)

    def states(self, inputs, training=None):
        """inputs as for `call` -> decoder states [batch, T, d_model]; `logits` finishes the pass.

        The trainer applies the 8000+-way output layer to non-pad positions only.
        """
        source, target_in = inputs["source"], inputs["target_in"]
        return self.decode_states(target_in, self.encode(source, training=training), source,
                                  training=training)

    def logits(self, states):
        """[..., d_model] decoder states -> float32 logits [..., vocab] (the shared table)."""
        return self.target_embedding.logits(states)

    def call(self, inputs, training=None):
        """inputs: {"source": [batch, S], "target_in": [batch, T]} -> float32 logits [batch, T, vocab]."""
        return self.logits(self.states(inputs, training=training))

    # -- incremental decoding ------------------------------------------------
    def initial_cache(self, memory, source, max_length=None):
        """The decoding cache: fixed-shape for up to `max_length` steps, or growing.

        Returns {"memory": {"layers": [{"k", "v"}] * N, "bias": [batch, 1, 1, S]},
                 "self": [{"k": [batch, h, L, d_k], "v": [..., d_v]}] * N},
        L = max_length, or 0 when max_length is None: a growing cache, one
        position appended per step (pass growing=True to decode_step). A fixed
        shape is what XLA needs; growing is what graph mode wants, since every
        step then copies, reorders and attends over the positions decoded so
        far rather than over all max_length. Memory keys/values are projected
        here once per sentence.
        """
        batch = tf.shape(memory)[0]
        max_length = 0 if max_length is None else max_length
        memory_layers = []
        self_layers = []
        for layer in self.decoder.layers:
            k, v = layer.cross_attention.project_memory(memory)
            memory_layers.append({"k": k, "v": v})
            self_layers.append({
                "k": tf.zeros([batch, self.num_heads, max_length, self.d_k], memory.dtype),
                "v": tf.zeros([batch, self.num_heads, max_length, self.d_v], memory.dtype)})
        bias = masks.attention_bias(masks.padding_mask(source))
        return {"memory": {"layers": memory_layers, "bias": bias}, "self": self_layers}

    def grow_cache(self, cache, max_length):
        """A fixed-shape cache padded to `max_length` positions (from a shorter
        initial_cache; beam_search's grow_cache)."""
        def pad(t):
            return tf.pad(t, [[0, 0], [0, 0], [0, max_length - tf.shape(t)[2]], [0, 0]])
        return {"memory": cache["memory"],
                "self": [{"k": pad(c["k"]), "v": pad(c["v"])} for c in cache["self"]]}

    def decode_step(self, ids, step, cache, growing=False):
        """Logits for the token after ids[:, step], reading earlier positions from `cache`.

        Args:
          ids: int32 [batch, L + 1] buffer; column 0 is BOS.
          step: int32 scalar.
          cache: from `initial_cache` (or a previous step).
          growing: whether the cache is the growing kind (initial_cache without
            max_length).
        Returns:
          (float32 logits [batch, vocab], updated cache).
        """
        token = ids[:, step][:, tf.newaxis]
        x = self.target_embedding(token, start_index=step)
        if growing:
            step_bias = None
        else:
            cache_length = tf.shape(cache["self"][0]["k"])[2]
            step_bias = masks.attention_bias(masks.step_mask(step, cache_length))
        y, new_self = self.decoder.call_step(x, step, cache, step_bias, cache["memory"]["bias"])
        logits = self.target_embedding.logits(y[:, 0])
        return logits, {"memory": cache["memory"], "self": new_self}

    def get_config(self):
        config = super().get_config()
        config.update(
            vocab_size=self.vocab_size, num_layers=self.num_layers, d_model=self.d_model,
            d_ff=self.d_ff, num_heads=self.num_heads, d_k=self.d_k, d_v=self.d_v,
            dropout=self.dropout, attention_dropout=self.attention_dropout,
            positions=self.positions, max_positions=self.max_positions,
            share_embeddings=self.share_embeddings, source_vocab_size=self.source_vocab_size,
            pre_norm=self.pre_norm, layer_norm_epsilon=self.layer_norm_epsilon)
        return config


def build_model(config: ModelConfig, dtype: str | None = None) -> Transformer:
    """Unpacks a ModelConfig into the layer arguments and builds the weights."""
    args = dataclasses.asdict(config)
    args["d_k"], args["d_v"] = config.key_dim, config.value_dim
    model = Transformer(**args, dtype=dtype, name="transformer")
    model.build()
    return model
