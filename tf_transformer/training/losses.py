"""Label-smoothed cross-entropy over non-pad target tokens (section 5.4)."""

import tensorflow as tf

from tf_transformer.config import PAD_ID


def smoothed_cross_entropy(logits: tf.Tensor, labels: tf.Tensor, label_smoothing: float):
    """Per-token loss and the non-pad weights.

    The smoothed target puts 1 - eps on the label and eps / (V - 1) on every
    other token, PAD included (as Tensor2Tensor does; no constant is
    subtracted). It goes through TensorFlow's fused softmax cross-entropy,
    whose kernel writes the logits' gradient in the forward pass: the backward
    pass is one multiply over [tokens, vocab], where a gather of the gold
    log-probability cost a dense UnsortedSegmentSum and a dozen more passes.
    Losses are float32 whatever the compute dtype.

    Args:
      logits: [..., vocab], e.g. [batch, T, vocab] or [tokens, vocab].
      labels: int [...]; PAD_ID positions get weight 0.
    Returns:
      (loss [...] float32, weights [...] float32 in {0, 1}).
    """
    logits = tf.cast(logits, tf.float32)
    vocab = tf.shape(logits)[-1]
    low = label_smoothing / tf.cast(vocab - 1, tf.float32)
    target = tf.stop_gradient(tf.one_hot(labels, vocab, on_value=1.0 - label_smoothing,
                                         off_value=low, dtype=tf.float32))
    loss = tf.nn.softmax_cross_entropy_with_logits(labels=target, logits=logits)
    weights = tf.cast(tf.not_equal(labels, PAD_ID), tf.float32)
    return loss * weights, weights


def loss_floor(vocab_size: int, label_smoothing: float) -> float:
    """The smallest possible value: the entropy of the smoothed target distribution."""
    import math

    eps, confidence = label_smoothing, 1.0 - label_smoothing
    floor = 0.0 if confidence == 0 else -confidence * math.log(confidence)
    if eps > 0:
        floor -= eps * math.log(eps / (vocab_size - 1))
    return floor


def mean_token_loss(logits, labels, label_smoothing: float) -> tf.Tensor:
    """Mean over non-pad tokens of one batch (evaluation; the trainer divides by
    the global token count itself)."""
    loss, weights = smoothed_cross_entropy(logits, labels, label_smoothing)
    return tf.reduce_sum(loss) / tf.maximum(tf.reduce_sum(weights), 1.0)
