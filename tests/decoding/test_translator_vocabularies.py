"""The Translator's vocabularies: <unk> never generated under byte fallback, and separate
source and target vocabularies (the source side's tokenizes, the target side's detokenizes).

The models have seeded random weights (the tiny models' widths, one layer each side: the
vocabularies are the point, and each Translator traces its search through every layer);
`_unk_prone` adds a large bias to the <unk> logit of every step, so a search that does not
forbid it emits <unk> all along.
"""

import random

import numpy as np
import tensorflow as tf
from model_fixtures import tiny_config

from tf_transformer.config import EOS_ID, PAD_ID, UNK_ID, DecodeConfig
from tf_transformer.cli.batching import translate_sentences
from tf_transformer.decoding.translator import Translator
from tf_transformer.inputs.tokenizer import Tokenizer, TokenizerPair
from tf_transformer.model.transformer import build_model

SENTENCES = ["Fonts", "Replacement table", "Enables the font replacement settings."]
UNK_TEXT = "\u2047"  # what <unk> detokenizes to
DECODE = DecodeConfig(beam_size=2, extra_length=4, parallel_searches=1)  # one trace: fast


def _model(vocab_size, seed=0, **overrides):
    """A model of `vocab_size` (target) pieces, 1+1 layers, seeded weights. Keras draws
    initializer seeds from Python's and NumPy's generators (never tf.random.set_seed: it
    clears the SentencePiece resources of other tests)."""
    random.seed(seed)
    np.random.seed(seed)
    return build_model(tiny_config(vocab_size, num_layers=1, **overrides).model)


def _unk_prone(model):
    """The model's decode_step with +30 on the <unk> logit."""
    bias = 30.0 * tf.one_hot(UNK_ID, model.vocab_size)

    def decode_step(ids, step, cache):
        logits, cache = model.decode_step(ids, step, cache)
        return logits + bias, cache

    return decode_step


def test_unk_is_never_generated_with_a_byte_fallback_target_vocabulary(
        byte_fallback_model_path, spm_model_path):
    vocabulary = Tokenizer(byte_fallback_model_path)
    model = _model(vocabulary.vocab_size)
    translator = Translator(model, vocabulary, DECODE, 64, decode_step=_unk_prone(model))
    assert translator.model_search.never_ids == (UNK_ID,)
    out = translator.translate(tf.constant(SENTENCES))
    assert (out["length"].numpy() > 1).all()
    assert not any(UNK_TEXT in t.decode() for t in out["translation"].numpy())
    # A vocabulary without byte fallback keeps today's search: <unk> may win, and shows.
    legacy_vocabulary = Tokenizer(spm_model_path)
    legacy_model = _model(legacy_vocabulary.vocab_size)
    legacy = Translator(legacy_model, legacy_vocabulary, DECODE, 64,
                        decode_step=_unk_prone(legacy_model))
    assert legacy.model_search.never_ids == ()
    assert all(UNK_TEXT in t.decode() for t in
               legacy.translate(tf.constant(SENTENCES))["translation"].numpy())


def test_separate_vocabularies_tokenize_the_source_and_detokenize_the_target(
        spm_model_path, byte_fallback_model_path):
    source, target = Tokenizer(spm_model_path), Tokenizer(byte_fallback_model_path)  # 500, 600
    # Seed 1: outputs of ids below 500, which the source vocabulary detokenizes too (below).
    model = _model(target.vocab_size, seed=1, share_embeddings=False,
                   source_vocab_size=source.vocab_size)
    assert model.source_embedding.token_embedding.input_dim == source.vocab_size
    translator = Translator(model, TokenizerPair(source, target), DECODE, 64)
    assert (translator.tokenizer, translator.target_tokenizer) == (source, target)
    # <unk> is forbidden by the target vocabulary's byte fallback, not the source's.
    assert translator.model_search.never_ids == (UNK_ID,)
    assert Translator(model, TokenizerPair(target, source), DECODE, 64).model_search.never_ids == ()

    text = tf.constant(SENTENCES)
    source_ids = translator.source_ids(text).numpy()
    expected = [row + [EOS_ID] for row in source.tokenize(text).to_list()]
    assert [list(row[row != PAD_ID]) for row in source_ids] == expected
    assert expected != [row + [EOS_ID] for row in target.tokenize(text).to_list()]
    translations = translator.translate(text)["translation"].numpy()
    # The same search on the ids, eagerly: the search function `translate` traced.
    ids = translator.search(tf.constant(source_ids), tf.constant(translator.alpha),
                            tf.constant(translator.extra_length), nbest=1).ids[:, 0]
    np.testing.assert_array_equal(translations, target.detokenize(ids).numpy())
    assert (translations != source.detokenize(ids).numpy()).any()
    results = translate_sentences(translator, SENTENCES)
    assert [r.texts[0].encode() for r in results] == list(translations)
    assert [r.source_tokens for r in results] == [len(row) - 1 for row in expected]
