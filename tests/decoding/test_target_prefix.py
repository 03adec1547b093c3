"""The Translator's `translate_with_prefix` and `sample_with_prefix` (search/prefix.py) on the
EOS-prone tiny model: outputs start with their prefix, the prefix counts in the score as
`score` counts it, and an empty prefix is `translate` / `sample`."""

import numpy as np
import tensorflow as tf
from decoding_fixtures import SENTENCES

TEXT = tf.constant(SENTENCES + [""])
NONE = tf.constant([""] * len(SENTENCES) + [""])
# Target text to continue: two words, one word, none, and one per remaining sentence.
PREFIXES = ["Die Schrift", "Ersetzung", "", "Wenn Sie", "Immer", "Nur", "Schrift", "aktiviert", "x"]


def _numpy(out):
    return {k: v.numpy() for k, v in out.items()}


def test_an_empty_prefix_is_translate(beam4):
    expected = _numpy(beam4.translate(TEXT))
    got = _numpy(beam4.translate_with_prefix(TEXT, NONE))
    for key, value in expected.items():
        np.testing.assert_array_equal(got[key], value)


def test_outputs_start_with_their_prefix_and_score_as_score_does(beam4):
    out = _numpy(beam4.translate_with_prefix(TEXT, tf.constant(PREFIXES)))
    translations = [t.decode("utf-8") for t in out["translation"]]
    for text, prefix, translation in zip(SENTENCES, PREFIXES, translations):
        assert translation.startswith(prefix), (text, prefix, translation)
    assert translations[-1] == "" and out["length"][-1] == 0  # no source tokens: no output
    assert translations[:-1] != [t.decode() for t in beam4.translate(TEXT)["translation"][:-1].numpy()]
    # The same pairs teacher-forced: where the output re-tokenizes to the searched pieces
    # (its length), `score` gives the search's score, prefix included.
    scored = _numpy(beam4.score(TEXT[:-1], tf.constant(translations[:-1])))
    same = scored["tokens"] == out["length"][:-1]
    assert same.sum() >= len(SENTENCES) // 2, (scored["tokens"], out["length"])
    np.testing.assert_allclose(scored["score"][same], out["score"][:-1][same], rtol=1e-4)


def test_sampling_continues_the_prefix_and_an_empty_prefix_is_sample(greedy):
    seed = tf.constant(5, tf.int64)
    expected = _numpy(greedy.sample(TEXT, 0, 0.0, 0.0, seed))
    got = _numpy(greedy.sample_with_prefix(TEXT, NONE, 0, 0.0, 0.0, seed))
    for key, value in expected.items():
        np.testing.assert_array_equal(got[key], value)
    drawn = _numpy(greedy.sample_with_prefix(TEXT, tf.constant(PREFIXES), 0, 0.0, 0.0, seed))
    for prefix, translation in zip(PREFIXES, drawn["translation"][:-1]):
        assert translation.decode("utf-8").startswith(prefix), (prefix, translation)
