"""The Transformer (section 3): encoder-decoder with a shared embedding.

Entry points, each with one return type:
  build_model(config)                    -> a built Transformer
  call(inputs)                           -> float32 logits [batch, T, vocab] (training)
  states(inputs)                         -> decoder states [batch, T, d_model]
  states(inputs, training=True, dropout_key=key): the masks picked by `key` (layers/dropout.py)
  logits(states)                         -> float32 logits [..., vocab]
  encode(source, kernels)                -> memory [batch, S, d_model]
  decode_states(target_in, memory, src)  -> decoder states [batch, T, d_model]
  initial_cache(memory, source, empty, transpose_output, positions, kernels) -> DecoderCache
  decode_step(ids, step, cache, kernels) -> (float32 logits [batch, vocab], DecoderCache)
  decode_step(..., with_attention=True)  -> (logits, DecoderCache, float32 [batch, S])
`decode_step` is the `symbols_to_logits_fn` contract of search/beam_search.py;
`kernels` (model/kernels.py) picks the kernels the products run on: TRAINING
by default, STEP for a decoding step;
the trainer uses `states` + `logits` to project non-pad positions only.
Training inputs may be packed rows (inputs/packing.py): `PACKED_KEYS` add
segment ids, which mask attention to each pair (masks.py), and position ids.
"""

import dataclasses

import keras
import tensorflow as tf

from tf_transformer.config import PAD_ID, ModelConfig
from tf_transformer.model import cache as caches
from tf_transformer.model import kernels as kernels_lib
from tf_transformer.model import masks
from tf_transformer.model.cache import DecoderCache
from tf_transformer.model.layers import Decoder, Encoder, TokenAndPositionEmbedding

# Optional keys of `call`/`states` inputs: [batch, S] or [batch, T] int32 each.
PACKED_KEYS = ("source_segments", "source_positions", "target_segments", "target_positions")


@keras.saving.register_keras_serializable(package="tf_transformer")
class Transformer(keras.Model):
    """Encoder-decoder Transformer; arguments are ModelConfig's fields."""

    def __init__(self, vocab_size, num_layers, d_model, d_ff, num_heads, d_k, d_v, dropout,
                 attention_dropout=0.0, positions="sinusoid", max_positions=1024,
                 share_embeddings=True, source_vocab_size=0, pre_norm=False,
                 layer_norm_epsilon=1e-6, relu_dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        self.relu_dropout = relu_dropout
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
                          pre_norm=pre_norm, layer_norm_epsilon=layer_norm_epsilon,
                          relu_dropout=relu_dropout, dtype=policy)
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
    def encode(self, source, training=None, segments=None, positions=None,
               kernels: kernels_lib.Kernels = kernels_lib.TRAINING, dropout_key=None):
        """[batch, S] source ids -> memory [batch, S, d_model] (pad positions masked out).

        segments, positions: [batch, S] of a packed row (positions default to
        masks.segment_positions); self-attention stays within each segment.
        dropout_key: int64 scalar that picks every dropout mask, or None.
        """
        if segments is None:
            mask = masks.padding_mask(source)
        else:
            mask = masks.segment_mask(segments, segments)
            positions = masks.segment_positions(segments) if positions is None else positions
        x = self.source_embedding(source, position_ids=positions, training=training,
                                  dropout_key=dropout_key)
        return self.encoder(x, masks.attention_bias(mask), training=training, kernels=kernels,
                            dropout_key=dropout_key)

    def decode_states(self, target_in, memory, source, training=None, target_segments=None,
                      target_positions=None, source_segments=None, dropout_key=None):
        """Teacher-forced decoder output before the softmax layer: [batch, T, d_model].

        Packed rows give target_segments [batch, T] and source_segments
        [batch, S] together: self-attention causal within a target segment,
        cross-attention from target segment i to source segment i.
        dropout_key: int64 scalar that picks every dropout mask, or None.
        """
        if (target_segments is None) != (source_segments is None):
            raise ValueError("packed rows need both target_segments and source_segments")
        if target_segments is None:
            self_mask = masks.decoder_self_mask(target_in)
            memory_mask = masks.padding_mask(source)
        else:
            self_mask = masks.packed_decoder_self_mask(target_segments)
            memory_mask = masks.segment_mask(target_segments, source_segments)
            if target_positions is None:
                target_positions = masks.segment_positions(target_segments)
        # A shared embedding's second call in a pass (the source's was its first).
        call = 1 if self.share_embeddings else 0
        x = self.target_embedding(target_in, position_ids=target_positions, training=training,
                                  dropout_key=dropout_key, dropout_call=call)
        return self.decoder(x, memory, masks.attention_bias(self_mask),
                            masks.attention_bias(memory_mask), training=training,
                            dropout_key=dropout_key)

    def states(self, inputs, training=None, dropout_key=None):
        """inputs as for `call` -> decoder states [batch, T, d_model]; `logits` finishes the pass.

        The trainer applies the 8000+-way output layer to non-pad positions only.
        `dropout_key` (int64 scalar) picks every dropout mask of the pass, as flax's
        `rngs`: the same key, the same masks (layers/dropout.py). Without it, training
        draws from each Dropout's SeedGenerator, as Keras's Dropout does.
        """
        source, target_in = inputs["source"], inputs["target_in"]
        packed = {k: inputs.get(k) for k in PACKED_KEYS}
        memory = self.encode(source, training=training, segments=packed["source_segments"],
                             positions=packed["source_positions"], dropout_key=dropout_key)
        return self.decode_states(target_in, memory, source, training=training,
                                  target_segments=packed["target_segments"],
                                  target_positions=packed["target_positions"],
                                  source_segments=packed["source_segments"],
                                  dropout_key=dropout_key)

    def logits(self, states):
        """[..., d_model] decoder states -> float32 logits [..., vocab] (the shared table)."""
        return self.target_embedding.logits(states)

    def call(self, inputs, training=None, dropout_key=None):
        """inputs: {"source": [batch, S], "target_in": [batch, T]}, optionally PACKED_KEYS
        -> float32 logits [batch, T, vocab]; `dropout_key` as for `states`."""
        return self.logits(self.states(inputs, training=training, dropout_key=dropout_key))

    # -- incremental decoding ------------------------------------------------
    def initial_cache(self, memory, source, empty: caches.EmptyCache = caches.chunked(),
                      transpose_output: bool = True, positions=0,
                      kernels: kernels_lib.Kernels = kernels_lib.TRAINING,
                      memory_multiple: int = 1) -> DecoderCache:
        """The decoding cache of a batch: memory [batch, S, d_model], source [batch, S] ids.

        Memory keys/values are projected here, once per sentence. `empty` makes
        each layer's self-attention cache: caches.chunked() (graph mode: a
        buffer grown by chunks, written in place), caches.growing() (each step
        copies the positions decoded so far) or caches.fixed(L) (XLA: static
        shapes, L positions). With
        `transpose_output` the output table is transposed here, once, for a
        plain GEMM per step (TensorFlow's kernels); without, each step's GEMM
        reads the table with transpose_b (XLA's dot is faster that way:
        BUILD.md, performance decisions). `positions` > 0 (an int or an int32 scalar, at
        most max_positions): the position vectors of decoding steps
        0..positions-1 are made here, once, and a step reads its row (graph
        mode; 0: each step makes its own, which XLA fuses). `kernels` run the
        memory's projections. `memory_multiple` > 1: the projected memory and its
        bias are padded, masked, to a multiple of that many positions (the step's
        Kernels.memory_multiple).
        """
        batch = tf.shape(memory)[0]
        pad = (-tf.shape(source)[1]) % memory_multiple if memory_multiple > 1 else 0

        def padded(x, axis, value=0):  # x with `pad` positions more on `axis`
            if memory_multiple == 1:
                return x
            paddings = [[0, pad if i == axis else 0] for i in range(len(x.shape))]
            return tf.pad(x, paddings, constant_values=value)

        self_caches, keys, values = [], [], []
        for layer in self.decoder.layers:
            k, v = layer.cross_attention.project_memory(memory, kernels)
            keys.append(padded(k, axis=2))
            values.append(padded(v, axis=2))
            self_caches.append(empty(batch, self.num_heads, self.d_k, self.d_v, memory.dtype))
        bias = masks.attention_bias(masks.padding_mask(padded(source, axis=1, value=PAD_ID)))
        table = (self.target_embedding.output_table(memory.dtype) if transpose_output
                 else caches.NOT_MADE)
        position_table = caches.NOT_MADE
        if not isinstance(positions, int) or positions > 0:
            position_table = self.target_embedding.position_table(positions)
        return DecoderCache(tuple(self_caches), tuple(keys), tuple(values), bias, table,
                            position_table)

    def decode_step(self, ids, step, cache: DecoderCache,
                    kernels: kernels_lib.Kernels = kernels_lib.STEP,
                    with_attention: bool = False):
        """Logits for the token after ids[:, step], reading earlier positions from `cache`.

        Args:
          ids: int32 [batch, width]; column 0 is BOS.
          step: int32 scalar.
          cache: from `initial_cache` (or a previous step), either kind.
          kernels: the step's kernel policy (model/kernels.py).
          with_attention: also return the last decoder layer's cross-attention
            averaged over heads (the search's alignments).
        Returns:
          (float32 logits [batch, vocab], the cache with position `step` written), and
          with `with_attention` the attention float32 [batch, S] third.
        """
        token = ids[:, step][:, tf.newaxis]
        vectors = None
        if caches.made(cache.position_table):
            vectors = cache.position_table[step][tf.newaxis]  # [1, d_model]
        x = self.target_embedding(token, start_index=step, position_vectors=vectors)
        out = self.decoder.step(x, step, cache, kernels, with_attention)
        y, self_caches = out[:2]
        table = cache.output_table if caches.made(cache.output_table) else None
        logits = self.target_embedding.logits(y[:, 0], table, kernels)
        if with_attention:
            return logits, cache._replace(self_attention=self_caches), out[2]
        return logits, cache._replace(self_attention=self_caches)

    def get_config(self):
        config = super().get_config()
        config.update(
            vocab_size=self.vocab_size, num_layers=self.num_layers, d_model=self.d_model,
            d_ff=self.d_ff, num_heads=self.num_heads, d_k=self.d_k, d_v=self.d_v,
            dropout=self.dropout, attention_dropout=self.attention_dropout,
            positions=self.positions, max_positions=self.max_positions,
            share_embeddings=self.share_embeddings, source_vocab_size=self.source_vocab_size,
            pre_norm=self.pre_norm, layer_norm_epsilon=self.layer_norm_epsilon,
            relu_dropout=self.relu_dropout)
        return config


def build_model(config: ModelConfig, dtype: str | None = None) -> Transformer:
    """Unpacks a ModelConfig into the layer arguments and builds the weights."""
    args = dataclasses.asdict(config)
    args["d_k"], args["d_v"] = config.key_dim, config.value_dim
    model = Transformer(**args, dtype=dtype, name="transformer")
    model.build()
    return model
