"""Bounded shapes (search/shape_buckets.py): the Translator's graph-mode searches pad the
batch and the source width to buckets and shrink by buckets, with the unpadded search's
outputs, so a server meets a fixed set of shapes."""

import random

import numpy as np
import pytest
import tensorflow as tf
from decoding_fixtures import SENTENCES, translator

from tf_transformer.search import shape_buckets

WORDS = " ".join(SENTENCES).split()


def test_row_buckets_and_padding():
    assert [int(shape_buckets.rows(n)) for n in range(0, 14)] == [
        1, 1, 2, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12, 16]
    assert shape_buckets.row_buckets(1) == [1]
    assert shape_buckets.row_buckets(13) == [1, 2, 4, 8, 12, 16]
    padded = shape_buckets.pad_sources(tf.constant([[5, 6, 3], [7, 3, 0], [3, 0, 0]]), 64)
    assert padded.shape == (4, 16)
    np.testing.assert_array_equal(padded[:3, :3], [[5, 6, 3], [7, 3, 0], [3, 0, 0]])
    assert int(tf.reduce_sum(padded[:, 3:])) == 0 and int(tf.reduce_sum(padded[3])) == 0
    # Widths: 16, then powers of two, never past the model's positions: 20 columns, at most
    # 24 -> 24; 30 at most 24 -> 30.
    assert shape_buckets.width_buckets(100) == [16, 32, 64, 100]
    assert [int(shape_buckets.width(s, 100)) for s in (1, 16, 17, 33, 64, 65, 100, 120)] == [
        16, 16, 32, 64, 64, 100, 100, 120]
    assert shape_buckets.pad_sources(tf.ones([2, 20], tf.int32), 24).shape == (2, 24)
    assert shape_buckets.pad_sources(tf.ones([2, 30], tf.int32), 24).shape == (2, 30)


def _sentences(seed, count):
    """`count` sentences of 1-14 words."""
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(1, 14))) for _ in range(count)]


class _ShapeRecorder:
    """A decode_step that records (ids rows, memory rows, memory width) of every step."""

    def __init__(self, model):
        self.model, self.seen = model, set()

    def __call__(self, ids, step, cache, **kwargs):
        shapes = tf.stack([tf.shape(ids)[0], tf.shape(cache.memory_bias)[0],
                           tf.shape(cache.memory_bias)[3]])
        tf.py_function(lambda s: self.seen.add(tuple(s.numpy().tolist())), [shapes], [])
        return self.model.decode_step(ids, step, cache, **kwargs)


def _pair(model, model_dir, **decode):
    """(bounded, unbounded) Translators with recording steps."""
    pair = []
    for bounded in (True, False):
        recorder = _ShapeRecorder(model)
        pair.append((translator(model, model_dir, decode_step=recorder, bounded_shapes=bounded,
                                **decode), recorder))
    return pair


@pytest.fixture(scope="module")
def beam_pair(eos_prone_model, tiny_model_dir):
    return _pair(eos_prone_model, tiny_model_dir, beam_size=3, nbest=2, parallel_searches=1)


def test_beam_outputs_equal_the_unpadded_search_on_every_bucket(beam_pair):
    (bounded, recorder), (unbounded, free_recorder) = beam_pair
    # Batch sizes 1-13 cover the buckets 1, 2, 4, 8, 12 and 16; sources of 1-14 words.
    for size in range(1, 14):
        texts = tf.constant(_sentences(size, size))
        got, expected = bounded.translate_nbest(texts), unbounded.translate_nbest(texts)
        np.testing.assert_array_equal(got["translations"], expected["translations"])
        np.testing.assert_array_equal(got["lengths"], expected["lengths"])
        np.testing.assert_allclose(got["scores"], expected["scores"], rtol=1e-5, atol=1e-6)
    beam, buckets = 3, shape_buckets.row_buckets(13)
    widths = shape_buckets.width_buckets(bounded.max_source_length)
    for ids_rows, memory_rows, width in recorder.seen:
        assert memory_rows in buckets and width in widths, recorder.seen
        assert ids_rows in (memory_rows, memory_rows * beam), recorder.seen
    # Without buckets, the same batches meet other shapes (the check can fail).
    assert any(rows not in buckets or width not in widths for _, rows, width in free_recorder.seen)


def test_prefixed_and_sampled_outputs_equal_the_unpadded_search(beam_pair, eos_prone_model,
                                                                 tiny_model_dir):
    (bounded, _), (unbounded, _) = beam_pair
    texts = tf.constant(_sentences(0, 7) + ["Fonts", "Screen only"])
    prefixes = tf.constant([""] * 7 + ["Font", "checked"])
    got = bounded.translate_with_prefix(texts, prefixes)
    expected = unbounded.translate_with_prefix(texts, prefixes)
    np.testing.assert_array_equal(got["translation"], expected["translation"])
    np.testing.assert_allclose(got["score"], expected["score"], rtol=1e-5, atol=1e-6)
    (greedy, _), (free, _) = _pair(eos_prone_model, tiny_model_dir, beam_size=1,
                                   parallel_searches=1)
    settings = (tf.constant(5), tf.constant(0.9), tf.constant(1.0), tf.constant(3, tf.int64))
    got, expected = greedy.sample(texts, *settings), free.sample(texts, *settings)
    np.testing.assert_array_equal(got["translation"], expected["translation"])
    np.testing.assert_allclose(got["score"], expected["score"], rtol=1e-5, atol=1e-6)
