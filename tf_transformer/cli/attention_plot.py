"""Attention heat maps of one translation, in the spirit of the paper's appendix figures.

The weights are recorded, not recomputed: during one teacher-forced pass over
the decoded output, every `attention_weights` call of the model's attention
layers (SelfAttention, CrossAttention) is wrapped to keep its result, so the maps are exactly what the forward
pass computes (post- or pre-norm alike) and no layer logic is copied here.
"""

from __future__ import annotations

import contextlib

import numpy as np
import tensorflow as tf

from tf_transformer.config import BOS_ID, EOS_ID
from tf_transformer.decoding.translator import Translator
from tf_transformer.model import Transformer

KINDS = {"encoder_self": "encoder self-attention",
         "decoder_self": "decoder self-attention",
         "decoder_cross": "encoder-decoder attention"}


@contextlib.contextmanager
def recording(model: Transformer):
    """Yields {kind: [None] * N}; filled with each layer's [batch, h, T, S] weights.

    Inside, each attention layer's `attention_weights` is wrapped on the instance; its
    arguments (the kernel policy among them) pass through unchanged. Unwrapped on exit."""
    records = {kind: [None] * model.num_layers for kind in KINDS}
    targets = []
    for i, layer in enumerate(model.encoder.layers):
        targets.append((layer.self_attention, "encoder_self", i))
    for i, layer in enumerate(model.decoder.layers):
        targets.append((layer.self_attention, "decoder_self", i))
        targets.append((layer.cross_attention, "decoder_cross", i))

    def recorder(attention, kind, i):
        original = attention.attention_weights

        def attention_weights(q, k, bias, *args, **kwargs):
            weights = original(q, k, bias, *args, **kwargs)
            records[kind][i] = weights
            return weights
        return attention_weights

    try:
        for attention, kind, i in targets:
            attention.attention_weights = recorder(attention, kind, i)
        yield records
    finally:
        for attention, _, _ in targets:
            if "attention_weights" in attention.__dict__:
                del attention.__dict__["attention_weights"]


def attention_maps(model: Transformer, source: tf.Tensor, target_in: tf.Tensor) -> dict:
    """Teacher-forced pass (eager, no dropout) -> {kind: float32 [N, batch, h, T, S]}.

    source [batch, S] (x + EOS), target_in [batch, T] (BOS + y). Kinds:
    encoder_self [.., S, S], decoder_self [.., T, T], decoder_cross [.., T, S].
    """
    with recording(model) as records:
        model({"source": source, "target_in": target_in}, training=False)
    return {kind: np.stack([np.asarray(w) for w in maps]) for kind, maps in records.items()}


def plot_attention(maps: dict, source_pieces: list[str], target_pieces: list[str], path: str,
                   kinds=("encoder_self", "decoder_cross"), title: str = "") -> str:
    """Draws one panel per (kind, layer, head) for the first sentence of `maps`; writes `path`.

    Rows are layers of each kind, columns heads; a query's row sums to 1.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    num_layers, _, num_heads = maps[kinds[0]].shape[:3]
    longest = max(len(source_pieces), len(target_pieces))
    size = max(2.0, 0.16 * longest + 1.0)
    rows = len(kinds) * num_layers
    fig, axes = plt.subplots(rows, num_heads, figsize=(size * num_heads, size * rows),
                             squeeze=False)
    for r, (kind, layer) in enumerate((k, l) for k in kinds for l in range(num_layers)):
        queries = source_pieces if kind == "encoder_self" else target_pieces
        keys = target_pieces if kind == "decoder_self" else source_pieces
        for head in range(num_heads):
            ax = axes[r, head]
            weights = maps[kind][layer, 0, head, :len(queries), :len(keys)]
            ax.imshow(weights, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
            ax.set_xticks(range(len(keys)), keys, rotation=90, fontsize=6)
            ax.set_yticks(range(len(queries)), queries, fontsize=6)
            ax.set_title(f"{KINDS[kind]}, layer {layer + 1}, head {head + 1}", fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_translation(translator: Translator, sentence: str, path: str) -> str:
    """Translates `sentence` (the translator's settings) and plots its attention to `path`."""
    source = translator.source_ids(tf.constant([sentence]))
    result = translator.translate_ids(source)
    length = int(result["lengths"][0, 0])
    output = result["ids"][0, 0, :length].numpy()
    target_in = np.concatenate([[BOS_ID], output[:-1]]).astype(np.int32)[np.newaxis]
    maps = attention_maps(translator.model, source, tf.constant(target_in))

    def pieces(ids, tokenizer):
        return [p.decode("utf-8", errors="replace")
                for p in tokenizer.id_to_piece(tf.constant(ids, tf.int32)).numpy()]

    # the token each query predicts, EOS included
    target_pieces = pieces(output, translator.target_tokenizer)
    if length and output[-1] != EOS_ID:
        target_pieces[-1] += " (max length)"
    return plot_attention(maps, pieces(source[0].numpy(), translator.tokenizer), target_pieces,
                          path, title=f"source: {sentence[:80]}")
