"""The Translator's alignments: the search's are the model's own last-layer cross-attention
for the hypotheses it returns, asking for them changes no output, and <unk> pieces are
replaced by the source text they align to."""

import random

import numpy as np
import pytest
import sentencepiece
import tensorflow as tf
from decoding_fixtures import SENTENCES, translator
from model_fixtures import tiny_config

from tf_transformer.cli import attention_plot
from tf_transformer.config import BOS_ID, UNK_ID
from tf_transformer.decoding import alignments as alignments_lib
from tf_transformer.inputs.tokenizer import Tokenizer
from tf_transformer.model.transformer import build_model


def test_alignments_are_the_cross_attention_and_change_no_output(beam4):
    """Each n-best hypothesis's alignment rows equal the teacher-forced pass's last
    decoder layer cross-attention averaged over heads (attention_plot records it),
    through beam reorders, finished merges and sentences leaving the batch."""
    text = tf.constant(SENTENCES + [""])
    source = beam4.source_ids(text).numpy()
    plain = {k: v.numpy() for k, v in beam4.translate_ids(tf.constant(source)).items()}
    aligned = {k: v.numpy() for k, v in beam4.translate_nbest_with_alignments(text).items()}
    lengths = plain["lengths"]
    np.testing.assert_array_equal(aligned["lengths"][:-1], lengths[:-1])
    np.testing.assert_array_equal(aligned["scores"][:-1], plain["scores"][:-1])
    texts = beam4.tokenizer.detokenize(tf.reshape(plain["ids"][:-1], [-1, plain["ids"].shape[2]]))
    np.testing.assert_array_equal(aligned["translations"][:-1].reshape(-1), texts.numpy())
    source_lengths = aligned["source_lengths"]
    np.testing.assert_array_equal(source_lengths, [*(source[:-1] > 0).sum(1), 0])
    assert len(set(lengths[:, 0])) > 3
    for b in range(len(SENTENCES)):
        for n in range(2):
            length = lengths[b, n]
            target_in = np.concatenate([[BOS_ID], plain["ids"][b, n, :length - 1]])[np.newaxis]
            maps = attention_plot.attention_maps(beam4.model, source[b:b + 1, :source_lengths[b]],
                                                 tf.constant(target_in, tf.int32))
            expected = maps["decoder_cross"][-1, 0].mean(axis=0)  # [length, S]
            got = aligned["alignments"][b, n]
            np.testing.assert_allclose(got[:length, :source_lengths[b]], expected, atol=1e-5)
            assert not got[length:].any() and not got[:, source_lengths[b]:].any()
    assert not aligned["alignments"][-1].any() and aligned["translations"][-1, 0] == b""
    for empty in ([], [""]):
        out = beam4.translate_nbest_with_alignments(tf.constant(empty, tf.string))
        assert out["alignments"].shape[:2] == [len(empty), 2]
        assert list(out["translations_unk_replaced"].numpy().reshape(-1)) == [b""] * 2 * len(empty)


def test_unknown_pieces_are_replaced_by_their_aligned_source_text(tiny_model_dir,
                                                                   spm_model_path):
    """Scripted: the step forces <unk> at steps 0 and 2, attending (one-hot) to the
    source's own unknown character, then to its first piece. The replaced text has
    those source spans where the plain text has the unknown surface. (Seeded random
    weights, one layer each side: the outputs run to their maximum length.)"""
    random.seed(0)  # Keras draws initializer seeds from Python's and NumPy's generators
    np.random.seed(0)
    model = build_model(tiny_config(Tokenizer(spm_model_path).vocab_size, num_layers=1).model)
    source = "Hello \u2713 world"  # the check mark is not in the vocabulary: <unk>
    pieces = sentencepiece.SentencePieceProcessor(model_file=spm_model_path)
    source_ids = pieces.encode(source)
    check_mark = source_ids.index(UNK_ID)
    forced = tf.constant([0, 2])
    columns = tf.constant([check_mark, 0])

    def forcing_step(ids, step, cache, with_attention=False):
        out = model.decode_step(ids, step, cache, with_attention=with_attention)
        hit = tf.reduce_any(step == forced)
        logits = tf.where(hit, tf.one_hot(UNK_ID, tf.shape(out[0])[1], 50.0, -50.0), out[0])
        if not with_attention:
            return logits, out[1]
        column = tf.gather(columns, tf.argmax(tf.cast(step == forced, tf.int32)))
        attention = tf.where(hit, tf.one_hot(column, tf.shape(out[2])[1]), out[2])
        return logits, out[1], attention

    decoder = translator(model, tiny_model_dir, forcing_step, beam_size=2, extra_length=6,
                         parallel_searches=1)
    out = decoder.translate_with_alignments(tf.constant([source, "Fonts"]))
    plain = out["translation"].numpy()[0].decode()
    assert plain.count(alignments_lib.UNK_SURFACE) == 2
    first_piece = pieces.decode_pieces([pieces.id_to_piece(source_ids[0])])  # "H"
    expected = plain.replace(alignments_lib.UNK_SURFACE, "\u2713", 1)
    expected = expected.replace(alignments_lib.UNK_SURFACE, first_piece, 1)
    assert out["translation_unk_replaced"].numpy()[0].decode() == expected
    assert out["translation_unk_replaced"].numpy()[1] != out["translation"].numpy()[1]


@pytest.mark.parametrize("texts,counts", [
    (["a \u2047 b"], [2]),  # two unknowns, one surface: unchanged
    (["", "x \u2047 "], [0, 1]),
])
def test_a_text_without_one_surface_per_unknown_is_left_alone(texts, counts):
    n = len(texts)
    width = max(counts) or 1
    target = np.full([n, width], 5, np.int32)
    for row, count in enumerate(counts):
        target[row, :count] = UNK_ID
    got = alignments_lib.replace_unknown_target(
        tf.constant(texts), tf.constant(target), tf.ones([n, width, 3]) / 3,
        tf.constant(["src one"] * n), tf.constant([[0, 3, 4]] * n, tf.int64),
        tf.constant([[3, 4, 7]] * n, tf.int64), tf.constant([3] * n))
    expected = [t if c != t.count("\u2047") else t.replace(" \u2047 ", "src")
                for t, c in zip(texts, counts)]
    assert [t.decode() for t in got.numpy()] == expected
