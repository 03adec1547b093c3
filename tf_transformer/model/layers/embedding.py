"""Token embeddings scaled by sqrt(d_model) plus positions (sections 3.4, 3.5).

The token table is keras-hub's `ReversibleEmbedding`: the same matrix embeds
source and target tokens and, transposed, is the pre-softmax projection.
Sinusoids come from keras-hub's `SinePositionEncoding` (interleaved sin/cos,
exactly the paper's PE(pos, 2i) and PE(pos, 2i+1)), computed in float32 even
under mixed precision: bfloat16 cannot represent positions above 256 exactly.
"""

import keras
import keras_hub
import tensorflow as tf

from tf_transformer.model import kernels as kernels_lib
from tf_transformer.model import shapes
from tf_transformer.model.layers.dropout import Dropout


@keras.saving.register_keras_serializable(package="tf_transformer")
class LearnedPositions(keras.layers.Layer):
    """A learned [max_positions, d_model] table (Table 3 row E)."""

    def __init__(self, max_positions, d_model, **kwargs):
        super().__init__(**kwargs)
        self.max_positions = max_positions
        self.d_model = d_model

    def build(self, input_shape=None):
        self.table = self.add_weight(
            name="table", shape=(self.max_positions, self.d_model),
            initializer=keras.initializers.RandomNormal(stddev=self.d_model ** -0.5))
        self.built = True

    def call(self, length, start_index=0):
        """-> [length, d_model] rows start_index .. start_index + length - 1."""
        return tf.slice(tf.convert_to_tensor(self.table), [start_index, 0], [length, self.d_model])

    def get_config(self):
        config = super().get_config()
        config.update(max_positions=self.max_positions, d_model=self.d_model)
        return config


@keras.saving.register_keras_serializable(package="tf_transformer")
class TokenAndPositionEmbedding(keras.layers.Layer):
    """Dropout(Embedding(ids) * sqrt(d_model) + PE) (sections 3.4, 3.5, 5.4).

    With shared embeddings the model uses one instance for source and target,
    and its `logits` (the transposed table) as the pre-softmax projection.
    Initialised N(0, d_model^-0.5), so scaled embeddings have unit variance.
    """

    def __init__(self, vocab_size, d_model, positions, max_positions, dropout, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.positions = positions
        self.max_positions = max_positions
        self.dropout = dropout
        self.token_embedding = keras_hub.layers.ReversibleEmbedding(
            vocab_size, d_model, tie_weights=True, name="token_embedding",
            embeddings_initializer=keras.initializers.RandomNormal(stddev=d_model ** -0.5),
            dtype=self.dtype_policy)
        if positions == "sinusoid":
            self.position_encoding = keras_hub.layers.SinePositionEncoding(
                name="position_encoding", dtype="float32")
        else:
            self.position_encoding = LearnedPositions(
                max_positions, d_model, name="position_encoding", dtype="float32")
        self.embedding_dropout = Dropout(dropout, dtype=self.dtype_policy)

    def build(self, input_shape=None):
        self.token_embedding.build((None, None))
        self.position_encoding.build((None, None, self.d_model))
        self.built = True

    def position_table(self, length, start_index=0):
        """[length, d_model] float32 position vectors for start_index onwards."""
        if self.positions == "sinusoid":
            return self.position_encoding(tf.zeros([1, length, self.d_model]),
                                          start_index=start_index)[0]
        # A tensor, not a Python int: Keras layers take tensors as first argument.
        return self.position_encoding(tf.convert_to_tensor(length, tf.int32),
                                      start_index=start_index)

    def call(self, ids, start_index=0, position_ids=None, position_vectors=None,
             training=None, dropout_key=None, dropout_call: int = 0):
        """[batch, length] int ids -> [batch, length, d_model] in the compute dtype.

        `position_ids` [batch, length] (packed rows: restarting at 0 per pair,
        each < length) pick each token's position vector; without them token
        t has position start_index + t. `position_vectors` [length, d_model]
        are those vectors already made (a decoding step reads its row of a table
        made once per search: `position_table`), so none is computed here.
        `dropout_key` and `dropout_call` pick the dropout mask (layers/dropout.py): a
        shared embedding is called once per side in a pass.
        """
        x = self.token_embedding(ids)
        x = x * tf.cast(self.d_model ** 0.5, x.dtype)
        table = position_vectors
        if table is None:
            table = self.position_table(tf.shape(ids)[1], start_index)
        if position_ids is not None:
            table = tf.gather(table, position_ids)  # [batch, length, d_model]
        x = x + tf.cast(table, x.dtype)
        return self.embedding_dropout(x, training=training, dropout_key=dropout_key,
                                      dropout_call=dropout_call)

    def logits(self, x, transposed_table=None,
               kernels: kernels_lib.Kernels = kernels_lib.TRAINING):
        """Pre-softmax projection with the transposed table: [..., d_model] -> float32 [..., vocab].

        One 2-D GEMM against the table with transpose_b, rather than the
        reversible layer's broadcasting matmul of an explicitly transposed copy.
        Decoding passes `transposed_table` ([d_model, vocab], `output_table`),
        made once per search: a plain GEMM per step, where Eigen's transpose_b
        GEMM is ~1.7x slower (BUILD.md, performance decisions).
        """
        x2 = tf.reshape(x, [-1, self.d_model])
        if transposed_table is None:
            table = tf.cast(self.token_embedding.embeddings, x.dtype)
            logits = kernels.projection(x2, table, adj_y=True)
        else:
            logits = kernels.projection(x2, tf.cast(transposed_table, x.dtype))
        return tf.cast(tf.reshape(logits, shapes.dims(x, -1) + [self.vocab_size]), tf.float32)

    def output_table(self, dtype) -> tf.Tensor:
        """The shared table transposed, [d_model, vocab] in `dtype`: `logits`'s
        `transposed_table`."""
        return tf.transpose(tf.cast(self.token_embedding.embeddings, dtype))

    def get_config(self):
        config = super().get_config()
        config.update(vocab_size=self.vocab_size, d_model=self.d_model, positions=self.positions,
                      max_positions=self.max_positions, dropout=self.dropout)
        return config
