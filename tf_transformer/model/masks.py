"""Attention masks, built once per forward pass and handed to the layers.

Masks are boolean (`True` = may attend). `attention_bias` turns one into the
additive float bias the attention softmax uses, so layers never look at ids.
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


def step_mask(step, cache_length) -> tf.Tensor:
    """[1, 1, 1, cache_length]: during incremental decoding, keys 0..step."""
    return (tf.range(cache_length) <= step)[tf.newaxis, tf.newaxis, tf.newaxis, :]


def attention_bias(mask: tf.Tensor) -> tf.Tensor:
    """Boolean mask -> float32 additive bias (0 where allowed, NEG_INF elsewhere)."""
    return tf.where(mask, 0.0, NEG_INF)
