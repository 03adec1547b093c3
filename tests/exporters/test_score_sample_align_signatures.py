"""The SavedModel's `score`, `sample`, `translate_with_prefix` and `translate_with_alignments` signatures give what
the in-process Translator gives (the session-scoped export of conftest.py)."""

import numpy as np
import tensorflow as tf
from saved_model_fixtures import dev_sentences


def _numpy(out):
    return {k: v.numpy() for k, v in out.items()}


def test_score_signature_equals_the_translator(loaded, translator):
    sources = dev_sentences(4) + ["Fonts", "bad \xff bytes"]
    targets = dev_sentences(4, start=10) + ["", "Schriftarten"]
    got = _numpy(loaded.signatures["score"](source=tf.constant(sources),
                                            target=tf.constant(targets)))
    expected = _numpy(translator.score(tf.constant(sources), tf.constant(targets)))
    assert set(got) == {"log_prob", "tokens", "log_prob_per_token", "score"}
    np.testing.assert_array_equal(got["tokens"], expected["tokens"])
    for key in ("log_prob", "log_prob_per_token", "score"):
        np.testing.assert_allclose(got[key], expected[key], rtol=1e-5)
    assert got["tokens"][4] == 1 and (got["log_prob"] < 0).all()


def test_sample_signature_equals_the_translator(loaded, translator):
    texts = tf.constant(dev_sentences(6) + [""])
    settings = (tf.constant(5), tf.constant(0.9), tf.constant(0.8), tf.constant(7, tf.int64))
    got = _numpy(loaded.signatures["sample"](
        text=texts, sampling_topk=settings[0], sampling_topp=settings[1],
        sampling_temperature=settings[2], seed=settings[3]))
    expected = _numpy(translator.sample(texts, *settings))
    np.testing.assert_array_equal(got["translation"], expected["translation"])
    np.testing.assert_array_equal(got["length"], expected["length"])
    np.testing.assert_allclose(got["score"], expected["score"], rtol=1e-5)
    other = loaded.signatures["sample"](text=texts, sampling_topk=settings[0],
                                        sampling_topp=settings[1],
                                        sampling_temperature=settings[2],
                                        seed=tf.constant(8, tf.int64))
    assert (other["translation"].numpy() != got["translation"]).any()


def test_translate_with_alignments_signature_equals_the_translator(loaded, translator):
    texts = tf.constant(dev_sentences(5) + [""])
    got = _numpy(loaded.signatures["translate_with_alignments"](text=texts))
    expected = _numpy(translator.translate_with_alignments(texts))
    assert set(got) == set(expected)
    for key in ("translation", "translation_unk_replaced", "length", "target_tokens",
                "source_length"):
        np.testing.assert_array_equal(got[key], expected[key])
    np.testing.assert_allclose(got["score"], expected["score"], rtol=1e-5)
    np.testing.assert_allclose(got["alignment"], expected["alignment"], atol=1e-6)
    # The plain translation is translate's.
    np.testing.assert_array_equal(
        got["translation"], loaded.signatures["serving_default"](text=texts)["translation"])


def test_translate_with_prefix_signature_equals_the_translator(loaded, translator):
    texts = tf.constant(dev_sentences(4) + ["", "Fonts"])
    prefixes = tf.constant(["Die", "", "Mit der", "Hallo", "", "Schrift"])
    got = _numpy(loaded.signatures["translate_with_prefix"](text=texts, prefix=prefixes))
    expected = _numpy(translator.translate_with_prefix(texts, prefixes))
    assert set(got) == {"translation", "score", "length"}
    np.testing.assert_array_equal(got["translation"], expected["translation"])
    np.testing.assert_array_equal(got["length"], expected["length"])
    np.testing.assert_allclose(got["score"], expected["score"], rtol=1e-5)
    for translation, prefix in zip(got["translation"], prefixes.numpy()):
        assert translation.startswith(prefix), (translation, prefix)
    # Without prefixes, translate's outputs.
    free = loaded.signatures["translate_with_prefix"](text=texts, prefix=tf.fill([6], ""))
    np.testing.assert_array_equal(free["translation"].numpy(),
                                  loaded.signatures["serving_default"](text=texts)["translation"])
