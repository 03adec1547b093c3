"""OpenNMT-tf model of the small-cpu protocol (`onmt-main --model=bench/compare/opennmt_model.py`).

The protocol's sizes, as close to tf_transformer's as OpenNMT-tf allows: post-norm unless
OPENNMT_PRE_NORM=1, no attention or FFN dropout, one embedding matrix for source, target and
the softmax, no output bias (bench/compare/README.md, "Each peer's configuration", says why).
"""

import os

import opennmt


def model():
    # The schedule setting picks the norm position: trainings.train_opennmt sets OPENNMT_PRE_NORM.
    return opennmt.models.Transformer(
        source_inputter=opennmt.inputters.WordEmbedder(embedding_size=256),
        target_inputter=opennmt.inputters.WordEmbedder(embedding_size=256),
        num_layers=3,
        num_units=256,
        num_heads=4,
        ffn_inner_dim=1024,
        dropout=0.1,
        attention_dropout=0.0,
        ffn_dropout=0.0,
        share_embeddings=opennmt.models.EmbeddingsSharingLevel.ALL,
        pre_norm=os.environ.get("OPENNMT_PRE_NORM", "0") == "1",
        output_layer_bias=False,
    )
