"""Keras layers of the Transformer, one concept per module (section 3)."""

from tf_transformer.layers.attention import MultiHeadAttention
from tf_transformer.layers.decoder import Decoder, DecoderLayer
from tf_transformer.layers.embedding import LearnedPositions, TokenAndPositionEmbedding
from tf_transformer.layers.encoder import Encoder, EncoderLayer
from tf_transformer.layers.feed_forward import FeedForward

__all__ = [
    "Decoder", "DecoderLayer", "Encoder", "EncoderLayer", "FeedForward",
    "LearnedPositions", "MultiHeadAttention", "TokenAndPositionEmbedding",
]
