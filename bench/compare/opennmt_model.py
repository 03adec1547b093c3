"""OpenNMT-tf model of the small-cpu protocol (`onmt-main --model=bench/compare/opennmt_model.py`).

The catalog's Transformer classes fix base/big sizes and pre-norm; this is the
protocol's architecture, built as close to tf_transformer's `small` preset as
OpenNMT-tf allows:
  3 + 3 layers, d_model 256, 4 heads, d_ff 1024, ReLU;
  post-norm (pre_norm=False), the paper's (OpenNMT-tf defaults to pre-norm), unless
  OPENNMT_PRE_NORM=1 (the schedule sweep's pre-norm settings);
  dropout 0.1 on sub-layer outputs and embeddings; attention_dropout and ffn_dropout
  0.0: the paper has neither and tf_transformer applies neither;
  one embedding matrix for source, target and the pre-softmax projection
  (EmbeddingsSharingLevel.ALL, needs the same vocabulary file on both sides) and no
  output bias, as ours;
  sinusoidal positions (OpenNMT-tf's are [sin | cos] concatenated, ours interleaved:
  a permutation of the same features, no difference to what the model can learn).
"""

import os

import opennmt


def model():
    # The dev-split schedule sweep (bench/schedule_sweep.py --system=opennmt) also tries
    # pre-norm: trainings.train_opennmt sets OPENNMT_PRE_NORM for its runs.
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
