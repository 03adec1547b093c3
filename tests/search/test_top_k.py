"""chunked_top_k equals tf.math.top_k, values and indices, ties and -inf included."""

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.search.top_k import chunked_top_k


def _rows(seed, rows, n, levels):
    """Few distinct values (many ties), some -inf, one row all -inf but a few."""
    rng = np.random.default_rng(seed)
    values = rng.integers(0, levels, size=(rows, n)).astype(np.float32)
    values[rng.random((rows, n)) < 0.3] = -np.inf
    values[0] = -np.inf
    values[0, [5, n - 1]] = 1.0
    return tf.constant(values)


@pytest.mark.parametrize("n,chunk", [(1000, 64), (32000, 128), (777, 16)])
@pytest.mark.parametrize("k", [1, 4, 8])
@pytest.mark.parametrize("levels", [3, 1000])
def test_equals_top_k_with_ties(n, chunk, k, levels):
    values = _rows(n + k + levels, rows=6, n=n, levels=levels)
    expected = tf.math.top_k(values, k=k)
    got = chunked_top_k(values, k, chunk=chunk)
    np.testing.assert_array_equal(got[0].numpy(), expected.values.numpy())
    np.testing.assert_array_equal(got[1].numpy(), expected.indices.numpy())


def test_equals_top_k_under_xla():
    values = _rows(7, rows=5, n=4 * 8000, levels=50)
    compiled = tf.function(lambda v: chunked_top_k(v, 4), autograph=False, jit_compile=True)
    expected = tf.math.top_k(values, k=4)
    got = compiled(values)
    np.testing.assert_array_equal(got[0].numpy(), expected.values.numpy())
    np.testing.assert_array_equal(got[1].numpy(), expected.indices.numpy())


def test_short_rows_use_top_k_itself():
    values = tf.constant([[3.0, 1.0, 3.0, 2.0]])
    values_k, index = chunked_top_k(values, 2, chunk=128)
    np.testing.assert_array_equal(index.numpy(), [[0, 2]])
