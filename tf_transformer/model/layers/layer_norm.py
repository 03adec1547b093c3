"""LayerNorm (section 3.1) whose training pass carries its gradient in closed form."""

import keras
import tensorflow as tf


class LayerNormalization(keras.layers.LayerNormalization):
    """keras.layers.LayerNormalization over the last axis; in training, its backward
    pass is the closed form, not TensorFlow's differentiation of the forward ops.

    With x_hat = (x - mean) / sigma and g = dy * gamma (statistics in float32, as
    Keras computes them for bfloat16 and float16 inputs):

      dx = (g - mean(g) - x_hat * mean(g * x_hat)) / sigma,
      dgamma = sum(dy * x_hat),  dbeta = sum(dy).

    The forward pass keeps x_hat and 1 / sigma for it. Differentiating Keras's
    forward ops (casts, moments, rsqrt, the folded scale and shift) writes about
    twice as many passes over [tokens, d_model]; in bfloat16 training the norms
    were ~10% of a step. Outside training (decoding, evaluation) the layer is
    Keras's own, op for op. Weights, their names and checkpoints are Keras's.
    """

    def call(self, inputs, training=None):
        if not training or not self._closed_form_applies():
            return super().call(inputs)
        return _normalize(inputs, tf.convert_to_tensor(self.gamma),
                          tf.convert_to_tensor(self.beta), self.epsilon, self.compute_dtype)

    def _closed_form_applies(self) -> bool:
        return self.axis in (-1, [-1]) and self.center and self.scale and not self.rms_scaling


def _normalize(x, gamma, beta, epsilon, output_dtype):
    """LayerNorm of x over its last axis, in float32, cast to `output_dtype`, with
    the closed-form gradient for x, gamma and beta (float32 gamma and beta)."""
    sum_axes = list(range(len(x.shape) - 1))

    @tf.custom_gradient
    def forward(x, gamma, beta):
        z = tf.cast(x, tf.float32)
        mean, variance = tf.nn.moments(z, axes=[-1], keepdims=True)
        inverse_sigma = tf.math.rsqrt(variance + epsilon)
        x_hat = (z - mean) * inverse_sigma

        def backward(dy):
            dy = tf.cast(dy, tf.float32)
            g = dy * gamma
            dz = inverse_sigma * (g - tf.reduce_mean(g, axis=-1, keepdims=True)
                                  - x_hat * tf.reduce_mean(g * x_hat, axis=-1, keepdims=True))
            return (tf.cast(dz, x.dtype), tf.reduce_sum(dy * x_hat, axis=sum_axes),
                    tf.reduce_sum(dy, axis=sum_axes))
        return tf.cast(x_hat * gamma + beta, output_dtype), backward

    return forward(x, gamma, beta)
