"""Dropout drops P_drop of the elements in every compute dtype (section 5.4: P_drop = 0.1)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.model.layers.dropout import Dropout

ELEMENTS = 1 << 22  # the drop fraction's standard deviation at P_drop 0.1: 1.5e-4


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_drops_p_drop_of_the_elements_and_scales_the_rest(dtype):
    dropout = Dropout(0.1, seed=3, dtype=dtype)
    out = dropout(tf.ones([ELEMENTS // 1024, 1024], dtype), training=True)
    out = tf.cast(out, tf.float32).numpy()
    dropped = np.mean(out == 0)
    assert dropped == pytest.approx(0.1, abs=6e-4)  # Keras's bfloat16 draw: 0.1016
    kept = np.unique(out[out != 0])
    assert kept.tolist() == [float(tf.cast(tf.constant(1 / 0.9), dtype))]
    assert np.mean(out) == pytest.approx(1.0, abs=2.5e-3)  # bfloat16's 1/0.9 is 0.16% low


def test_inference_is_the_identity_and_the_gradient_is_the_mask():
    dropout = Dropout(0.5, seed=1)
    x = tf.random.normal([64, 32])
    assert dropout(x, training=False) is x
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = dropout(x, training=True)
    kept = y.numpy() != 0
    assert 0.3 < kept.mean() < 0.7
    np.testing.assert_allclose(tape.gradient(y, x).numpy(), kept * 2.0)
    np.testing.assert_allclose(y.numpy(), np.where(kept, x.numpy() * 2.0, 0.0), rtol=1e-6)


@pytest.mark.parametrize("last_axis", [1024, 1023], ids=["paired_draws", "one_draw_each"])
def test_both_draws_drop_p_drop_independently_per_element(last_axis):
    out = Dropout(0.5, seed=7)(tf.ones([ELEMENTS // last_axis, last_axis]), training=True)
    kept = out.numpy()[:, :last_axis // 2 * 2] != 0
    assert kept.mean() == pytest.approx(0.5, abs=1e-3)
    # Neighbours (which may share one 32-bit draw) are independent: both kept a quarter.
    assert np.mean(kept[:, 0::2] & kept[:, 1::2]) == pytest.approx(0.25, abs=1e-3)


def test_a_seed_draw_decides_the_mask():
    one, two = Dropout(0.3, seed=5), Dropout(0.3, seed=5)
    x = tf.ones([16, 64])
    assert np.array_equal(one(x, training=True).numpy(), two(x, training=True).numpy())
    assert not np.array_equal(one(x, training=True).numpy(), two(x, training=False).numpy())
    assert isinstance(one, keras.layers.Dropout)  # what training/seeds.py finds
