"""Scoring given pairs (decoding/scoring.py through the Translator): the score of the
beam's own output is the score the beam reported, so scoring and search agree on
what a hypothesis is worth; the text path equals the ids path."""

import numpy as np
import pytest
import tensorflow as tf
from decoding_fixtures import SENTENCES

from tf_transformer.config import EOS_ID, PAD_ID
from tf_transformer.decoding import scoring


def test_teacher_forced_inputs_append_eos_and_cut():
    target = tf.constant([[7, 8, EOS_ID, PAD_ID], [9, PAD_ID, PAD_ID, PAD_ID], [5, 6, 7, 8]])
    target_in, target_out = scoring.teacher_forced(target, max_tokens=4)
    np.testing.assert_array_equal(target_in, [[2, 7, 8, 0], [2, 9, 0, 0], [2, 5, 6, 7]])
    np.testing.assert_array_equal(target_out, [[7, 8, EOS_ID, 0], [9, EOS_ID, 0, 0],
                                               [5, 6, 7, EOS_ID]])


@pytest.mark.parametrize("beam", [1, 4])
def test_the_score_of_the_beams_output_is_the_beams_score(greedy, beam4, beam):
    """Every n-best hypothesis that ended by EOS, scored as a (source, hypothesis) pair
    at alpha 0 and 0.6: log_prob / lp(tokens) equals the beam's score, and tokens its
    length."""
    decoder = {1: greedy, 4: beam4}[beam]
    nbest = decoder.nbest
    source = decoder.source_ids(tf.constant(SENTENCES))
    for alpha in (0.0, 0.6):
        result = decoder.translate_ids(source, alpha=alpha)
        ids, scores, lengths = (result[k].numpy() for k in ("ids", "scores", "lengths"))
        ended = ids[np.arange(len(SENTENCES))[:, None], np.arange(nbest)[None],
                    np.maximum(lengths - 1, 0)] == EOS_ID  # [B, nbest]
        assert ended.sum() >= ended.size // 2  # half or more end by EOS
        for n in range(nbest):
            got = {k: v.numpy() for k, v in
                   decoder.score_ids(source, result["ids"][:, n], alpha=alpha).items()}
            chosen = ended[:, n]
            np.testing.assert_array_equal(got["tokens"][chosen], lengths[chosen, n])
            np.testing.assert_allclose(got["score"][chosen], scores[chosen, n], rtol=1e-4,
                                       atol=1e-4)
            np.testing.assert_allclose(got["log_prob_per_token"],
                                       got["log_prob"] / got["tokens"], rtol=1e-6)
            penalty = ((5.0 + got["tokens"]) / 6.0) ** alpha
            np.testing.assert_allclose(got["score"], got["log_prob"] / penalty, rtol=1e-5)


def test_text_path_equals_ids_path_and_alpha_overrides(greedy):
    decoder = greedy
    targets = ["Schriftarten", "Ersetzungstabelle", "", "x " * 100]
    got = decoder.score(tf.constant(SENTENCES[:4]), tf.constant(targets))
    target_ids = decoder.tokenizer.tokenize(tf.constant(targets)).to_tensor()
    expected = decoder.score_ids(decoder.source_ids(tf.constant(SENTENCES[:4])), target_ids)
    for key in ("log_prob", "tokens", "score"):
        np.testing.assert_array_equal(got[key].numpy(), expected[key].numpy())
    assert got["tokens"].numpy()[2] == 1  # an empty target: EOS alone
    assert (got["log_prob"].numpy() < 0).all()
    assert decoder.score(tf.constant([], tf.string), tf.constant([], tf.string))["score"].shape == [0]
    flat = decoder.score(tf.constant(SENTENCES[:4]), tf.constant(targets), alpha=0.0)
    np.testing.assert_allclose(flat["score"].numpy(), got["log_prob"].numpy(), rtol=1e-6)
