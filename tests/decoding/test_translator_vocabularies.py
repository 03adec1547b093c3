"""The Translator's vocabularies: <unk> never generated under byte fallback, and separate
source and target vocabularies (the source side's tokenizes, the target side's detokenizes).

The models have random weights (tiny, 2+2 layers); `_unk_prone` adds a large bias to the
<unk> logit of every step, so a search that does not forbid it emits <unk> all along.
"""

import numpy as np
import pytest
import tensorflow as tf
from model_fixtures import make_model_dir

from tf_transformer.config import EOS_ID, PAD_ID, UNK_ID, DecodeConfig
from tf_transformer.cli.batching import translate_sentences
from tf_transformer.decoding.translator import Translator
from tf_transformer.inputs.tokenizer import Tokenizer, TokenizerPair
from tf_transformer.model.transformer import build_model
from tf_transformer.model_dir import ModelDir

SENTENCES = ["Fonts", "Replacement table", "Enables the font replacement settings."]
UNK_TEXT = "\u2047"  # what <unk> detokenizes to
DECODE = DecodeConfig(beam_size=2, extra_length=4, parallel_searches=1)  # one trace: fast


def _model(model_dir):
    model = build_model(ModelDir(model_dir).read_config().model)
    tf.train.Checkpoint(model=model).restore(tf.train.latest_checkpoint(model_dir)).expect_partial()
    return model


def _unk_prone(model):
    """The model's decode_step with +30 on the <unk> logit."""
    bias = 30.0 * tf.one_hot(UNK_ID, model.vocab_size)

    def decode_step(ids, step, cache):
        logits, cache = model.decode_step(ids, step, cache)
        return logits + bias, cache

    return decode_step


@pytest.fixture(scope="module")
def byte_fallback_model_dir(tmp_path_factory, byte_fallback_model_path):
    with open(byte_fallback_model_path, "rb") as f:
        return make_model_dir(str(tmp_path_factory.mktemp("model") / "bytes"), f.read())


def test_unk_is_never_generated_with_a_byte_fallback_target_vocabulary(
        byte_fallback_model_dir, byte_fallback_model_path, tiny_model_dir, spm_model_path):
    model = _model(byte_fallback_model_dir)
    translator = Translator(model, Tokenizer(byte_fallback_model_path), DECODE, 64,
                            decode_step=_unk_prone(model))
    assert translator.model_search.never_ids == (UNK_ID,)
    out = translator.translate(tf.constant(SENTENCES))
    assert (out["length"].numpy() > 1).all()
    assert not any(UNK_TEXT in t.decode() for t in out["translation"].numpy())
    # A vocabulary without byte fallback keeps today's search: <unk> may win, and shows.
    legacy_model = _model(tiny_model_dir)
    legacy = Translator(legacy_model, Tokenizer(spm_model_path), DECODE, 64,
                        decode_step=_unk_prone(legacy_model))
    assert legacy.model_search.never_ids == ()
    assert all(UNK_TEXT in t.decode() for t in
               legacy.translate(tf.constant(SENTENCES))["translation"].numpy())


def test_separate_vocabularies_tokenize_the_source_and_detokenize_the_target(
        tmp_path, spm_model_path, byte_fallback_model_path):
    source, target = Tokenizer(spm_model_path), Tokenizer(byte_fallback_model_path)  # 500, 600
    shape_dir = ModelDir(make_model_dir(str(tmp_path / "shape"), target.model_proto))
    config = shape_dir.read_config().model
    model = build_model(config.__class__(**{**config.__dict__, "share_embeddings": False,
                                            "source_vocab_size": source.vocab_size}))
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
    ids = translator.translate_ids(tf.constant(source_ids))["ids"][:, 0]
    translations = translator.translate(text)["translation"].numpy()
    np.testing.assert_array_equal(translations, target.detokenize(ids).numpy())
    assert (translations != source.detokenize(ids).numpy()).any()
    results = translate_sentences(translator, SENTENCES)
    assert [r.texts[0].encode() for r in results] == list(translations)
    assert [r.source_tokens for r in results] == [len(row) - 1 for row in expected]
