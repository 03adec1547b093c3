"""Tokenizer: fixed special ids, in-graph round trip, robust to bad input."""

import os
import unicodedata

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf
from model_fixtures import REPO_ROOT

from tf_transformer.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID
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
    # NFKC normalisation and unknown characters are the only allowed changes.
    exact = [unicodedata.normalize("NFKC", t) == d or UNK_ID in row
             for t, d, row in zip(dev_texts, decoded, ids.to_list())]
    assert np.mean(exact) == 1.0
    assert np.mean([t == d for t, d in zip(dev_texts, decoded)]) > 0.95


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

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def round_trip(self, texts):
            return self.vocab.detokenize(self.vocab.tokenize(texts).to_tensor())

    tf.saved_model.save(Serving(small_tokenizer), str(tmp_path))
    loaded = tf.saved_model.load(str(tmp_path))
    out = loaded.round_trip(tf.constant(["Open the file.", ""]))
    assert [t.decode() for t in out.numpy()] == ["Open the file.", ""]


def test_invalid_utf8_becomes_unk(small_tokenizer):
    ids = small_tokenizer.tokenize(tf.constant([b"Open \xff the \xc3", b"\x80\x80"]))
    assert UNK_ID in ids[0].numpy() and UNK_ID in ids[1].numpy()
    out = small_tokenizer.detokenize(ids).numpy()
    assert all(isinstance(t.decode("utf-8"), str) for t in out)


def test_training_is_deterministic_and_loads_from_bytes(tmp_path, embedded_corpus):
    texts = embedded_corpus.sources[:1000] + embedded_corpus.targets[:1000]
    for model_type in tokenizer.MODEL_TYPES:
        first = tokenizer.train_sentencepiece(texts, 300, str(tmp_path / "a.model"),
                                              model_type=model_type)
        second = tokenizer.train_sentencepiece(texts, 300, None, model_type=model_type)
        assert first == second
        from_bytes = tokenizer.Tokenizer(first)
        from_path = tokenizer.Tokenizer(tmp_path / "a.model")
        assert from_bytes.model_proto == from_path.model_proto
        assert from_bytes.vocab_size == 300


def test_rejects_models_with_other_special_ids(tmp_path, embedded_corpus):
    spm.SentencePieceTrainer.train(sentence_iterator=iter(embedded_corpus.sources[:500]),
                                   model_prefix=str(tmp_path / "default"), vocab_size=200,
                                   minloglevel=2)
    with pytest.raises(ValueError, match="special pieces"):
        tokenizer.Tokenizer(str(tmp_path / "default.model"))
