"""masks.py on its own: boolean masks from ids and positions, and the additive bias."""

import numpy as np
import tensorflow as tf

from tf_transformer.model import masks

IDS = tf.constant([[5, 6, 7, 0], [8, 0, 0, 0]], tf.int32)  # PAD is 0


def test_padding_mask_marks_non_pad_keys():
    mask = masks.padding_mask(IDS).numpy()
    assert mask.shape == (2, 1, 1, 4)
    np.testing.assert_array_equal(mask[:, 0, 0], [[1, 1, 1, 0], [1, 0, 0, 0]])


def test_causal_mask_is_lower_triangular():
    mask = masks.causal_mask(4).numpy()
    assert mask.shape == (1, 1, 4, 4)
    np.testing.assert_array_equal(mask[0, 0], np.tril(np.ones((4, 4), bool)))


def test_decoder_self_mask_is_causal_and_hides_padding():
    mask = masks.decoder_self_mask(IDS).numpy()
    assert mask.shape == (2, 1, 4, 4)
    expected = np.tril(np.ones((4, 4), bool)) & (IDS.numpy() != 0)[:, None, :]
    np.testing.assert_array_equal(mask[:, 0], expected)


def test_step_mask_shows_keys_up_to_the_step():
    mask = masks.step_mask(tf.constant(2), 5).numpy()
    assert mask.shape == (1, 1, 1, 5)
    np.testing.assert_array_equal(mask[0, 0, 0], [1, 1, 1, 0, 0])
    # Row `step` of the causal mask: a cached step attends as the full pass does.
    np.testing.assert_array_equal(mask[0, 0, 0], masks.causal_mask(5).numpy()[0, 0, 2])


def test_attention_bias_zeroes_masked_weights_after_softmax():
    bias = masks.attention_bias(masks.padding_mask(IDS))
    assert bias.dtype == tf.float32
    np.testing.assert_array_equal(bias.numpy()[1, 0, 0], [0.0, masks.NEG_INF, masks.NEG_INF,
                                                          masks.NEG_INF])
    weights = tf.nn.softmax(tf.random.normal([2, 1, 1, 4]) + bias).numpy()
    assert (weights[1, 0, 0, 1:] == 0.0).all() and weights[1, 0, 0, 0] == 1.0
    # Finite in bfloat16 too, where the logits may arrive before the float32 cast.
    assert np.isfinite(tf.cast(bias, tf.bfloat16).numpy().astype(np.float32)).all()


SEGMENTS = tf.constant([[1, 1, 2, 2, 2, 0], [1, 2, 3, 3, 0, 0]], tf.int32)


def test_segment_mask_keeps_attention_within_a_segment():
    mask = masks.segment_mask(SEGMENTS, SEGMENTS).numpy()
    assert mask.shape == (2, 1, 6, 6)
    s = SEGMENTS.numpy()
    expected = (s[:, :, None] == s[:, None, :]) & (s[:, None, :] > 0)
    np.testing.assert_array_equal(mask[:, 0], expected)
    assert not mask[0, 0, 1, 2] and mask[0, 0, 2, 4] and not mask[0, 0, 5].any()


def test_cross_segment_mask_pairs_target_i_with_source_i():
    source = tf.constant([[1, 1, 1, 2, 0, 0, 0]], tf.int32)
    target = tf.constant([[1, 2, 2, 0]], tf.int32)
    mask = masks.segment_mask(target, source).numpy()
    assert mask.shape == (1, 1, 4, 7)
    np.testing.assert_array_equal(mask[0, 0].astype(int), [[1, 1, 1, 0, 0, 0, 0],
                                                           [0, 0, 0, 1, 0, 0, 0],
                                                           [0, 0, 0, 1, 0, 0, 0],
                                                           [0, 0, 0, 0, 0, 0, 0]])


def test_packed_decoder_self_mask_is_causal_within_segments():
    mask = masks.packed_decoder_self_mask(SEGMENTS).numpy()
    s = SEGMENTS.numpy()
    expected = np.tril(np.ones((6, 6), bool)) & (s[:, :, None] == s[:, None, :]) & (s[:, None] > 0)
    np.testing.assert_array_equal(mask[:, 0], expected)
    # One segment is the unpacked decoder mask on real queries (padding queries see nothing).
    ones = tf.constant([[1, 1, 1, 0]], tf.int32)
    np.testing.assert_array_equal(
        masks.packed_decoder_self_mask(ones).numpy()[..., :3, :],
        masks.decoder_self_mask(tf.constant([[5, 6, 7, 0]])).numpy()[..., :3, :])


def test_segment_positions_restart_with_each_segment():
    np.testing.assert_array_equal(masks.segment_positions(SEGMENTS).numpy()[SEGMENTS.numpy() > 0],
                                  [0, 1, 0, 1, 2, 0, 0, 0, 1])
