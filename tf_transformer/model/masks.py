"""Attention masks, built once per forward pass and handed to the layers.

Masks are boolean (`True` = may attend). `attention_bias` turns one into the
additive float bias the attention softmax uses, so layers never look at ids.

Packed rows (inputs/packing.py) hold several pairs, told apart by segment ids
(1, 2, ... per pair, 0 for padding): attention stays within a segment, and
cross-attention goes from target segment i to source segment i only.
"""

import tensorflow as tf

from tf_transformer.config import PAD_ID

# Large enough that exp() underflows to exactly 0 in float32, small enough to
# stay finite when added to bfloat16/float16 logits after the float32 cast.
NEG_INF = -1e9


def padding_mask(ids: tf.Tensor) -> tf.Tensor:
    """[batch, length] ids -> [batch, 1, 1, length] mask of non-pad keys."""
    return tf.not_equal(ids, PAD_ID)[:, tf.newaxis, tf.newaxis, :]


def causal_mask(length) -> tf.Tensor:
    """[1, 1, length, length]: query i may attend to keys 0..i (section 3.2.3)."""
    positions = tf.range(length)
    return (positions[tf.newaxis, :] <= positions[:, tf.newaxis])[tf.newaxis, tf.newaxis]


def decoder_self_mask(target_ids: tf.Tensor) -> tf.Tensor:
    """[batch, 1, length, length]: causal and not attending to padded keys."""
    return tf.logical_and(causal_mask(tf.shape(target_ids)[1]), padding_mask(target_ids))


def segment_mask(query_segments: tf.Tensor, key_segments: tf.Tensor) -> tf.Tensor:
    """[batch, Q], [batch, K] segment ids -> [batch, 1, Q, K]: same segment, key not padding.

    Serves encoder self-attention (source, source) and cross-attention
    (target, source): target segment i sees source segment i only.
    """
    same = tf.equal(query_segments[:, :, tf.newaxis], key_segments[:, tf.newaxis, :])
    return tf.logical_and(same, tf.not_equal(key_segments, 0)[:, tf.newaxis, :])[:, tf.newaxis]


def packed_decoder_self_mask(target_segments: tf.Tensor) -> tf.Tensor:
    """[batch, T] segment ids -> [batch, 1, T, T]: causal within each segment."""
    return tf.logical_and(causal_mask(tf.shape(target_segments)[1]),
                          segment_mask(target_segments, target_segments))


def segment_positions(segments: tf.Tensor) -> tf.Tensor:
    """[batch, L] segment ids -> [batch, L] int32 positions, restarting at 0 per segment.

    A token's position is the number of earlier tokens of its segment (segments
    are contiguous); padding gets whatever it counts, it is masked everywhere.
    """
    length = tf.shape(segments)[1]
    earlier = tf.range(length)[tf.newaxis, :] < tf.range(length)[:, tf.newaxis]  # [q, k]: k < q
    same = tf.equal(segments[:, :, tf.newaxis], segments[:, tf.newaxis, :])
    return tf.reduce_sum(tf.cast(tf.logical_and(same, earlier), tf.int32), axis=-1)


def step_mask(step, cache_length) -> tf.Tensor:
    """[1, 1, 1, cache_length]: during incremental decoding, keys 0..step."""
    return (tf.range(cache_length) <= step)[tf.newaxis, tf.newaxis, tf.newaxis, :]


def attention_bias(mask: tf.Tensor) -> tf.Tensor:
    """Boolean mask -> float32 additive bias (0 where allowed, NEG_INF elsewhere)."""
    return tf.where(mask, 0.0, NEG_INF)
