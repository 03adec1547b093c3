"""Dropout whose drop probability is P_drop in every compute dtype (section 5.4), its masks
drawn from a key the caller passes."""

import random

import keras
import tensorflow as tf

_BITS = 16  # random bits per element: P_drop exact to 2^-17, one 32-bit draw per two elements
# Seeds apart of one layer's calls within a pass (a shared embedding is called twice).
CALL_STRIDE = 7919


class Dropout(keras.layers.Dropout):
    """keras.layers.Dropout, with each element's drop decided on 16 random bits.

    Keras draws its uniform numbers in the input's dtype. In bfloat16 they are
    multiples of 1/128 and the rate rounds up (0.1 to 0.10009765625), so a
    `mixed_bfloat16` model dropped 13/128 = 10.16% of its elements, not 10%.
    Here an element is dropped when 16 uniform random bits fall below
    round(rate * 2^16): P_drop = 6554 / 65536 = 0.100006 for 0.1, whatever the
    dtype. Two elements share one 32-bit draw of the counter-based generator
    (its bits split in halves) where the last axis is even: half the random
    numbers of a draw per element, which was 6% of a bfloat16 training step.
    The kept elements are scaled by 1 / (1 - rate) in the input's dtype
    (bfloat16 holds 1 / 0.9 as 1.109375, 0.16% low; float16 and float32 within 0.03%).

    Masks, as flax passes `rngs`: `call(inputs, training, dropout_key, dropout_call)`
    draws from the stateless seed [seed + CALL_STRIDE * dropout_call, dropout_key],
    a pure function of the key the caller passes (int64 scalar: the trainer's
    step, micro-batch and replica, training/step.py), this layer's `seed` (fixed at
    construction: drawn from Python's `random` as Keras draws a default seed, when
    not given) and which call of the layer within the pass (`dropout_call`). Without
    a key the seed comes from the layer's SeedGenerator, as Keras's Dropout draws it.
    A `noise_shape` (the model sets none) keeps Keras's own draw.
    """

    def __init__(self, rate, noise_shape=None, seed=None, **kwargs):
        if seed is None and rate > 0:
            seed = random.randint(1, int(1e9))  # keras.random.SeedGenerator's default draw
        super().__init__(rate, noise_shape=noise_shape, seed=seed, **kwargs)

    def call(self, inputs, training=False, dropout_key=None, dropout_call: int = 0):
        if not training or self.rate == 0:
            return inputs
        if self.noise_shape is not None:
            return super().call(inputs, training=training)
        if dropout_key is None:
            seed = tf.cast(self.seed_generator.next(), tf.int64)
        else:
            seed = tf.stack([tf.constant(self.seed + CALL_STRIDE * dropout_call, tf.int64),
                             tf.cast(dropout_key, tf.int64)])
        threshold = min(round(self.rate * 2 ** _BITS), 2 ** _BITS - 1)
        shape, last = tf.shape(inputs), inputs.shape[-1]
        if last is not None and last % 2 == 0:
            pairs = tf.concat([shape[:-1], [last // 2]], 0)
            bits = tf.random.stateless_uniform(pairs, seed, minval=None, maxval=None,
                                               dtype=tf.uint32)
            keep = tf.reshape(tf.bitcast(bits, tf.uint16), shape) >= tf.constant(
                threshold, tf.uint16)
        else:
            bits = tf.random.stateless_uniform(shape, seed, minval=None, maxval=None,
                                               dtype=tf.uint32)
            keep = bits >= tf.constant(threshold << (32 - _BITS), tf.uint32)
        mask = tf.cast(keep, inputs.dtype) * tf.constant(1.0 / (1.0 - self.rate), inputs.dtype)
        return inputs * mask
