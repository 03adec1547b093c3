"""The Transformer of section 3: layers, masks, the decoding cache and FLOP counts."""

from tf_transformer.model.transformer import Transformer, build_model

__all__ = ["Transformer", "build_model"]
