"""The Translator's outputs with alignments (`aligned_outputs`), and unknown target
pieces replaced by the source text they align to (OpenNMT's replace_unknown_target).

The search's alignments (search/alignment.py) are [B, nbest, T, S]: row t the
attention of target token t (the hypothesis's `length` tokens, EOS last when it
ended by one), column s source token s (EOS included, then PAD); an input without
tokens gets zeros and source length 0. `target_tokens` counts the rows before EOS.

Where a hypothesis holds the unknown piece (<unk>, UNK_ID), its alignment row
(search/alignment.py) points at a source token: the argmax over the source's
tokens (EOS excluded). That token's span of the source text (SentencePiece's
byte offsets), stripped of surrounding whitespace, replaces the unknown piece in
the detokenized hypothesis. SentencePiece detokenizes <unk> as its surface
" \\u2047 " (space, DOUBLE QUESTION MARK, space: the spaces are the surface's own,
not the pieces'), so the k-th surface is replaced by the k-th unknown's span and the
text reads as if the span had been the piece. A hypothesis whose text does not
hold exactly one surface per unknown piece is left as it is.
"""

from __future__ import annotations

import tensorflow as tf

from tf_transformer.config import UNK_ID
from tf_transformer.decoding import scoring
from tf_transformer.search.beam_search import AlignedSearchResult

UNK_SURFACE = " \u2047 "  # SentencePiece's default unk_surface


def aligned_source_tokens(alignments: tf.Tensor, source_tokens: tf.Tensor) -> tf.Tensor:
    """alignments float32 [N, T, S], source_tokens int32 [N] (EOS excluded) -> int32
    [N, T]: each target position's most attended source token (0 for an empty source)."""
    alignments = tf.pad(alignments, [[0, 0], [0, 0], [0, 1]])  # S + 1 >= 1 columns
    columns = tf.range(tf.shape(alignments)[2])[tf.newaxis, tf.newaxis]
    inside = columns < source_tokens[:, tf.newaxis, tf.newaxis]
    return tf.argmax(tf.where(inside, alignments, -1.0), axis=2, output_type=tf.int32)


def replace_unknown_target(texts: tf.Tensor, target_ids: tf.Tensor, alignments: tf.Tensor,
                           source_text: tf.Tensor, starts: tf.Tensor, ends: tf.Tensor,
                           source_tokens: tf.Tensor) -> tf.Tensor:
    """texts [N] (detokenized target_ids int32 [N, T]) -> [N] strings, each <unk> replaced
    by its aligned source span (module docstring).

    alignments float32 [N, T, S]; source_text [N] each hypothesis's source; starts,
    ends int64 [N, S' >= 1] the byte offsets of its tokens (the first source_tokens [N],
    EOS excluded)."""
    position = aligned_source_tokens(alignments, source_tokens)  # [N, T]
    begin = tf.gather(starts, position, batch_dims=1)
    length = tf.gather(ends, position, batch_dims=1) - begin
    text = tf.broadcast_to(source_text[:, tf.newaxis], tf.shape(position))
    spans = tf.strings.strip(tf.strings.substr(text, begin, length))  # [N, T]
    unknown = tf.logical_and(target_ids == UNK_ID, source_tokens[:, tf.newaxis] > 0)
    replacements = tf.ragged.boolean_mask(spans, unknown)  # [N, (unknowns)]
    parts = tf.strings.split(texts, sep=UNK_SURFACE)  # [N, (surfaces + 1)]
    surfaces = parts.row_lengths() - 1
    width = tf.reduce_max(tf.concat([parts.row_lengths(), [1]], axis=0))
    shape = tf.stack([tf.shape(texts, out_type=tf.int64)[0], width])
    dense_parts = parts.to_tensor("", shape=shape)
    dense_spans = replacements.to_tensor("", shape=shape)
    columns = tf.range(width, dtype=tf.int64)[tf.newaxis]
    # A text without one surface per unknown keeps its surfaces.
    matched = (replacements.row_lengths() == surfaces)[:, tf.newaxis]
    kept = tf.where(columns < surfaces[:, tf.newaxis], UNK_SURFACE, "")
    dense_spans = tf.where(matched, dense_spans, kept)
    return tf.strings.reduce_join(tf.strings.join([dense_parts, dense_spans]), axis=1)


def aligned_outputs(strings: tf.Tensor, result: AlignedSearchResult, text: tf.Tensor,
                    tokens: tf.RaggedTensor, starts: tf.RaggedTensor,
                    ends: tf.RaggedTensor) -> dict:
    """strings [B, nbest] (the detokenized hypotheses of `result`), text [B] the inputs,
    tokens, starts, ends [B, (tokens)] their source tokens (as searched, EOS excluded) and
    byte offsets -> {"translations", "translations_unk_replaced" [B, nbest],
    "alignments" float32 [B, nbest, T, S], "target_tokens" int32 [B, nbest] (EOS
    excluded), "source_lengths" int32 [B] (tokens + EOS)}."""
    batch, nbest = tf.shape(strings)[0], tf.shape(strings)[1]
    source_tokens = tf.cast(tokens.row_lengths(), tf.int32)

    def each_hypothesis(t):  # [B, ...] -> [B * nbest, ...]
        return tf.repeat(t, nbest, axis=0)

    shape = tf.shape(result.alignments)
    replaced = replace_unknown_target(
        tf.reshape(strings, [-1]), tf.reshape(result.ids, tf.stack([batch * nbest, -1])),
        tf.reshape(result.alignments, tf.concat([[batch * nbest], shape[2:]], 0)),
        each_hypothesis(text), each_hypothesis(_one_more_column(starts)),
        each_hypothesis(_one_more_column(ends)), each_hypothesis(source_tokens))
    empty = source_tokens == 0
    return {"translations": strings,
            "target_tokens": tf.where(empty[:, None], 0, scoring.target_length(result.ids)),
            "translations_unk_replaced": tf.reshape(replaced, tf.shape(strings)),
            "alignments": tf.where(empty[:, None, None, None], 0.0, result.alignments),
            "source_lengths": tf.where(empty, 0, source_tokens + 1)}


def _one_more_column(offsets: tf.RaggedTensor) -> tf.Tensor:
    """int64 [B, (n)] -> [B, max n + 1]: a column for aligned_source_tokens's 0 when a
    batch has no source token at all."""
    return tf.pad(offsets.to_tensor(), [[0, 0], [0, 1]])
