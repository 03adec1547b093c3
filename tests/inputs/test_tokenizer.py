"""Tokenizer: fixed special ids, in-graph round trip, robust to bad input, byte fallback,
one vocabulary per side."""

import os
import unicodedata

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf
from model_fixtures import REPO_ROOT

from tf_transformer.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID, VOCAB_MODEL_TYPES
from tf_transformer.inputs import corpus, tokenizer

DEV_TSV = os.path.join(REPO_ROOT,
                       "data", "libreoffice-help.en-de", "dev.tsv")


@pytest.fixture(scope="module")
def dev_texts():
    dev = corpus.read_tsv(DEV_TSV)
    return dev.sources[:300] + dev.targets[:300]


def test_special_ids(small_tokenizer):
    pieces = small_tokenizer.id_to_piece(tf.constant([PAD_ID, UNK_ID, BOS_ID, EOS_ID]))
    assert [p.decode() for p in pieces.numpy()] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert small_tokenizer.vocab_size == 500
    ids = small_tokenizer.tokenize(tf.constant(["Open the file."]))
    assert ids.dtype == tf.int32 and isinstance(ids, tf.RaggedTensor)
    assert not np.isin(ids.flat_values.numpy(), [PAD_ID, BOS_ID, EOS_ID]).any()


def test_round_trip(tokenizer_8k, dev_texts):
    ids = tokenizer_8k.tokenize(tf.constant(dev_texts))
    decoded = [t.decode() for t in tokenizer_8k.detokenize(ids).numpy()]
    # Byte fallback: NFKC normalisation is the only allowed change, and no piece is <unk>.
    assert tokenizer_8k.byte_fallback
    assert [unicodedata.normalize("NFKC", t) for t in dev_texts] == decoded
    assert UNK_ID not in ids.flat_values.numpy()
    assert np.mean([t == d for t, d in zip(dev_texts, decoded)]) > 0.95


# Each with characters the embedded corpus never shows (accented Latin, Greek, CJK, emoji;
# its German has ß, é and ü), already NFKC-normal.
UNSEEN = ["Bézier curves: naïve façade", "Straße nach Łódź", "Ωμέγα",
          "漢字かな交じり文", "Emoji 😀🚀 and ✓", "Kraków Zürich São Paulo"]


def test_byte_fallback_round_trips_every_character(byte_fallback_model_path, spm_model_path):
    vocab = tokenizer.Tokenizer(byte_fallback_model_path)
    assert vocab.byte_fallback and vocab.vocab_size == 600
    pieces = [p.decode() for p in vocab.id_to_piece(tf.range(4, 260)).numpy()]
    assert pieces == [f"<0x{b:02X}>" for b in range(256)]  # ids 4-259, after the special ones
    ids = vocab.tokenize(tf.constant(UNSEEN))
    assert UNK_ID not in ids.flat_values.numpy()
    assert [t.decode() for t in vocab.detokenize(ids).numpy()] == UNSEEN
    assert [t.decode() for t in vocab.detokenize(ids.to_tensor()).numpy()] == UNSEEN
    # Without byte fallback the same characters are <unk>, printed as " ⁇ ".
    legacy = tokenizer.Tokenizer(spm_model_path)
    assert not legacy.byte_fallback
    legacy_ids = legacy.tokenize(tf.constant(UNSEEN))
    assert all(UNK_ID in row for row in legacy_ids.to_list())
    assert all("\u2047" in t.decode() for t in legacy.detokenize(legacy_ids).numpy())


def test_byte_fallback_turns_invalid_utf8_into_replacement_characters(byte_fallback_model_path):
    vocab = tokenizer.Tokenizer(byte_fallback_model_path)
    ids = vocab.tokenize(tf.constant([b"Open \xff the \xc3", b"\x80\x80"]))
    assert UNK_ID not in ids.flat_values.numpy()
    assert [t.decode() for t in vocab.detokenize(ids).numpy()] == ["Open \ufffd the \ufffd",
                                                                 "\ufffd\ufffd"]


def test_byte_fallback_needs_room_for_the_bytes(embedded_corpus):
    texts = embedded_corpus.sources[:1000] + embedded_corpus.targets[:1000]
    with pytest.raises(ValueError, match="byte fallback takes 256 pieces"):
        tokenizer.train_sentencepiece(texts, 300)
    assert not tokenizer.Tokenizer(tokenizer.train_sentencepiece(
        texts, 300, byte_fallback=False)).byte_fallback


def test_one_vocabulary_per_side(tmp_path, embedded_corpus):
    """side="source"/"target" train on one side only; sides() and load() pair them."""
    pairs = corpus.Corpus(embedded_corpus.sources[:1000], embedded_corpus.targets[:1000])
    source = tokenizer.Tokenizer(tokenizer.train_sentencepiece(pairs, 400, side="source"))
    target = tokenizer.Tokenizer(tokenizer.train_sentencepiece(pairs, 400, side="target"))
    assert tokenizer.train_sentencepiece(pairs.sources, 400) == source.model_proto
    assert tokenizer.train_sentencepiece(pairs.targets, 400) == target.model_proto
    assert source.model_proto != target.model_proto
    shared = tokenizer.Tokenizer(tokenizer.train_sentencepiece(pairs, 400))
    assert tokenizer.sides(shared) == (shared, shared)
    pair = tokenizer.TokenizerPair(source, target)
    assert tokenizer.sides(pair) is pair
    for name, vocab in (("s.model", source), ("t.model", target)):
        (tmp_path / name).write_bytes(vocab.model_proto)
    loaded = tokenizer.load(str(tmp_path / "s.model"), str(tmp_path / "t.model"))
    assert [v.model_proto for v in loaded] == [source.model_proto, target.model_proto]
    one = tokenizer.load(str(tmp_path / "s.model"), str(tmp_path / "s.model"))
    assert isinstance(one, tokenizer.Tokenizer)
    with pytest.raises(ValueError, match="side"):
        tokenizer.train_sentencepiece(pairs.sources, 400, side="source")


def test_detokenize_ignores_pad_bos_and_after_eos(small_tokenizer):
    texts = ["Open the file.", "Speichern"]
    ids = small_tokenizer.tokenize(tf.constant(texts))
    decoder_output = tf.concat([tf.fill([2, 1], BOS_ID), ids, tf.fill([2, 1], EOS_ID),
                                tf.constant([[7, 8], [9, PAD_ID]])], axis=1).to_tensor(PAD_ID)
    assert [t.decode() for t in small_tokenizer.detokenize(decoder_output).numpy()] == texts
    assert [t.decode() for t in small_tokenizer.detokenize(ids).numpy()] == texts


def test_in_graph_and_saved_model(small_tokenizer, tmp_path):
    class Serving(tf.Module):
        def __init__(self, vocab):
            super().__init__()
            self.vocab = vocab

        @tf.function(autograph=False, input_signature=[tf.TensorSpec([None], tf.string)])
        def round_trip(self, texts):
            return self.vocab.detokenize(self.vocab.tokenize(texts).to_tensor())

    tf.saved_model.save(Serving(small_tokenizer), str(tmp_path))
    loaded = tf.saved_model.load(str(tmp_path))
    out = loaded.round_trip(tf.constant(["Open the file.", ""]))
    assert [t.decode() for t in out.numpy()] == ["Open the file.", ""]


def test_two_vocabularies_in_one_saved_model_stay_apart(small_tokenizer,
                                                         byte_fallback_model_path, tmp_path):
    """tensorflow-text names an op's resource after its node: two vocabularies under its
    default scope loaded as one (each side then detokenized with the same model)."""
    class Pair(tf.Module):
        def __init__(self, first, second):
            super().__init__()
            self.first, self.second = first, second

        @tf.function(autograph=False, input_signature=[tf.TensorSpec([None, None], tf.int32)])
        def detokenize_both(self, ids):
            return self.first.detokenize(ids), self.second.detokenize(ids)

    pair = Pair(small_tokenizer, tokenizer.Tokenizer(byte_fallback_model_path))
    ids = tf.constant([[300, 420, 480, 499]])
    expected = [t.numpy() for t in pair.detokenize_both(ids)]
    assert expected[0] != expected[1]
    tf.saved_model.save(pair, str(tmp_path))
    loaded = tf.saved_model.load(str(tmp_path))
    assert [t.numpy() for t in loaded.detokenize_both(ids)] == expected


def test_invalid_utf8_becomes_unk_without_byte_fallback(small_tokenizer):
    ids = small_tokenizer.tokenize(tf.constant([b"Open \xff the \xc3", b"\x80\x80"]))
    assert UNK_ID in ids[0].numpy() and UNK_ID in ids[1].numpy()
    out = small_tokenizer.detokenize(ids).numpy()
    assert all(isinstance(t.decode("utf-8"), str) for t in out)


def test_training_is_deterministic_and_loads_from_bytes(tmp_path, embedded_corpus):
    texts = embedded_corpus.sources[:1000] + embedded_corpus.targets[:1000]
    for model_type in VOCAB_MODEL_TYPES:
        first = tokenizer.train_sentencepiece(texts, 400, str(tmp_path / "a.model"),
                                              model_type=model_type)
        second = tokenizer.train_sentencepiece(texts, 400, None, model_type=model_type)
        assert first == second
        from_bytes = tokenizer.Tokenizer(first)
        from_path = tokenizer.Tokenizer(tmp_path / "a.model")
        assert from_bytes.model_proto == from_path.model_proto
        assert from_bytes.vocab_size == 400 and from_bytes.byte_fallback


def test_rejects_models_with_other_special_ids(tmp_path, embedded_corpus):
    spm.SentencePieceTrainer.train(sentence_iterator=iter(embedded_corpus.sources[:500]),
                                   model_prefix=str(tmp_path / "default"), vocab_size=200,
                                   minloglevel=2)
    with pytest.raises(ValueError, match="special pieces"):
        tokenizer.Tokenizer(str(tmp_path / "default.model"))
