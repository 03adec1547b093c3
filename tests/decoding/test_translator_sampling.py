"""The Translator's `sample`: a seed reproduces its outputs, and the greedy limits of
sampling (top-k 1, temperature -> 0) are the beam of one through the real model."""

import numpy as np
import pytest
import tensorflow as tf
from decoding_fixtures import SENTENCES

TEXT = tf.constant(SENTENCES + [""])


def _sample(translator, topk=0, topp=0.0, temperature=0.0, seed=0):
    out = translator.sample(TEXT, topk, topp, temperature, tf.constant(seed, tf.int64))
    return {k: v.numpy() for k, v in out.items()}


def test_a_seed_reproduces_the_outputs_another_changes_them(greedy):
    first = _sample(greedy, seed=1)
    again = _sample(greedy, seed=1)
    for key in first:
        np.testing.assert_array_equal(again[key], first[key])
    other = _sample(greedy, seed=2)
    assert (other["translation"] != first["translation"]).sum() >= 3
    nucleus = _sample(greedy, topp=0.9, temperature=0.7, seed=1)
    assert (nucleus["translation"] != first["translation"]).any()
    assert first["translation"][-1] == b"" and first["length"][-1] == 0
    empty = greedy.sample(tf.constant([], tf.string), 0, 0.0, 0.0, tf.constant(1, tf.int64))
    assert empty["translation"].shape == [0] and empty["score"].shape == [0]


@pytest.mark.parametrize("settings", [{"topk": 1}, {"temperature": 1e-4}])
def test_the_greedy_limits_are_the_beam_of_one(greedy, settings):
    expected = {k: v.numpy() for k, v in greedy.translate(TEXT).items()}
    got = _sample(greedy, seed=3, **settings)
    np.testing.assert_array_equal(got["translation"], expected["translation"])
    np.testing.assert_array_equal(got["length"], expected["length"])
    np.testing.assert_allclose(got["score"], expected["score"], rtol=1e-6)
    assert len(set(expected["length"])) > 3  # varied lengths, most ended by EOS
