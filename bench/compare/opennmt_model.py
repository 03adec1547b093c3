"""OpenNMT-tf model of the small-cpu protocol (`onmt-main --model=bench/compare/opennmt_model.py`):
the protocol's sizes (bench/compare/README.md, "Each peer's configuration")."""

import opennmt


def model(dropout=0.1, attention_dropout=0.0, ffn_dropout=0.0):
    """The protocol's model (its dropouts as the paper's: residual 0.1 only); the grid
    (opennmt_grid.py) sets all three."""
    return opennmt.models.Transformer(
        source_inputter=opennmt.inputters.WordEmbedder(embedding_size=256),
        target_inputter=opennmt.inputters.WordEmbedder(embedding_size=256),
        num_layers=3, num_units=256, num_heads=4, ffn_inner_dim=1024,
        dropout=dropout, attention_dropout=attention_dropout, ffn_dropout=ffn_dropout,
        share_embeddings=opennmt.models.EmbeddingsSharingLevel.ALL, pre_norm=True,
        output_layer_bias=False)
