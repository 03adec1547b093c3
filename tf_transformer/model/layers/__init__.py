"""Keras layers of the Transformer, one concept per module (section 3)."""

from tf_transformer.model.layers.attention import CrossAttention, SelfAttention
from tf_transformer.model.layers.decoder import Decoder, DecoderLayer
from tf_transformer.model.layers.embedding import (
    LearnedPositions,
    TokenAndPositionEmbedding,
)
from tf_transformer.model.layers.encoder import Encoder, EncoderLayer
from tf_transformer.model.layers.feed_forward import FeedForward

__all__ = [
    "CrossAttention", "Decoder", "DecoderLayer", "Encoder", "EncoderLayer", "FeedForward",
    "LearnedPositions", "SelfAttention", "TokenAndPositionEmbedding",
]
