"""Dropout whose drop probability is P_drop in every compute dtype (section 5.4)."""

import keras
import tensorflow as tf


class Dropout(keras.layers.Dropout):
    """keras.layers.Dropout, with each element's drop decided on 32 random bits.

    Keras draws its uniform numbers in the input's dtype. In bfloat16 they are
    multiples of 1/128 and the rate rounds up (0.1 to 0.10009765625), so a
    `mixed_bfloat16` model dropped 13/128 = 10.16% of its elements, not 10%.
    Here an element is dropped when its uniform uint32 falls below
    round(rate * 2^32): P_drop exact to 2^-32 whatever the dtype. The kept
    elements are scaled by 1 / (1 - rate) in the input's dtype (bfloat16 holds
    1 / 0.9 as 1.109375, 0.16% low; float16 and float32 within 0.03%).

    The seed is drawn from the layer's SeedGenerator as Keras's Dropout draws
    it (training/seeds.py redirects those draws per step and replica).
    """

    def call(self, inputs, training=False):
        if not training or self.rate == 0:
            return inputs
        if self.noise_shape is not None:
            return super().call(inputs, training=training)
        seed = tf.cast(self.seed_generator.next(), tf.int64)
        bits = tf.random.stateless_uniform(tf.shape(inputs), seed, minval=None, maxval=None,
                                           dtype=tf.uint32)
        threshold = min(round(self.rate * 2.0 ** 32), 2 ** 32 - 1)
        keep = tf.greater_equal(bits, tf.constant(threshold, tf.uint32))
        scale = tf.constant(1.0 / (1.0 - self.rate), inputs.dtype)
        return tf.where(keep, inputs * scale, tf.zeros([], inputs.dtype))
