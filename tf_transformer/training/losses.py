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
    target = tf.stop_gradient(_smoothed_target(labels, tf.shape(logits)[-1], label_smoothing))
    loss = tf.nn.softmax_cross_entropy_with_logits(labels=target, logits=logits)
    weights = _non_pad_weights(labels)
    return loss * weights, weights


def _smoothed_target(labels, vocab, label_smoothing):
    """[..., vocab] float32: 1 - eps on the label, eps / (V - 1) everywhere else."""
    low = label_smoothing / tf.cast(vocab - 1, tf.float32)
    return tf.one_hot(labels, vocab, on_value=1.0 - label_smoothing, off_value=low,
                      dtype=tf.float32)


def _non_pad_weights(labels):
    return tf.cast(tf.not_equal(labels, PAD_ID), tf.float32)


@tf.function(jit_compile=True, autograph=False)
def _loss_and_logits_gradient(logits, labels, label_smoothing):
    """smoothed_cross_entropy's loss (unweighted) and its gradient with respect to the
    logits, in the logits' dtype: one XLA program, which reads the logits twice and
    writes the gradient once."""
    z = tf.cast(logits, tf.float32)
    target = _smoothed_target(labels, tf.shape(z)[-1], label_smoothing)
    shifted = z - tf.reduce_max(z, axis=-1, keepdims=True)
    exp = tf.exp(shifted)
    total = tf.reduce_sum(exp, axis=-1, keepdims=True)
    loss = tf.reduce_sum(target * (tf.math.log(total) - shifted), axis=-1)
    return loss, tf.cast(exp / total - target, logits.dtype)


def compiled_smoothed_cross_entropy(logits: tf.Tensor, labels: tf.Tensor,
                                    label_smoothing: float):
    """smoothed_cross_entropy's contract and values, for training: the loss and its
    gradient come from one XLA program (the statistics in float32), and the backward
    pass is one multiply in the logits' dtype.

    TensorFlow's fused kernel runs as half a dozen passes over [tokens, vocab] in
    float32 (the cast logits, the one-hot target, its gradient, the upstream
    multiply, the cast back to bfloat16); here they are fused. XLA compiles once per
    shape: callers with a data-dependent token count pad it to a few sizes
    (trainer.py). The upstream gradient is rounded to the logits' dtype (the
    trainer's, a power-of-two loss scale times 0 or 1, is exact in bfloat16)."""
    @tf.custom_gradient
    def loss_of(logits):
        loss, gradient = _loss_and_logits_gradient(
            logits, labels, tf.constant(label_smoothing, tf.float32))

        def backward(upstream):
            return gradient * tf.cast(upstream[..., None], gradient.dtype)
        return loss, backward

    weights = _non_pad_weights(labels)
    return loss_of(logits) * weights, weights


@tf.function(jit_compile=True, autograph=False)
def _symmetric_kl_and_logits_gradients(first, second):
    """KL(P1||P2) + KL(P2||P1) per row and its gradients with respect to both logits,
    float32, one XLA program. With d = log P1 - log P2 the sum is sum_v (P1 - P2) d, and
    its gradient P1 (d - E_P1[d]) + P1 - P2 for the first logits (swap 1 and 2 for the
    second; the sign of d flips)."""
    log_p1 = tf.nn.log_softmax(tf.cast(first, tf.float32))
    log_p2 = tf.nn.log_softmax(tf.cast(second, tf.float32))
    p1, p2 = tf.exp(log_p1), tf.exp(log_p2)
    d = log_p1 - log_p2
    kl = tf.reduce_sum((p1 - p2) * d, axis=-1)
    mean_1 = tf.reduce_sum(p1 * d, axis=-1, keepdims=True)
    mean_2 = tf.reduce_sum(p2 * d, axis=-1, keepdims=True)
    return kl, p1 * (d - mean_1) + p1 - p2, p2 * (mean_2 - d) + p2 - p1


def compiled_symmetric_kl(first_logits: tf.Tensor, second_logits: tf.Tensor,
                          labels: tf.Tensor):
    """R-Drop's divergence of two passes' outputs (Liang et al. 2021, eq. 2) per target
    token: KL(P1||P2) + KL(P2||P1), both directions differentiated (as fairseq's
    `compute_kl_loss`, whose term is half of this sum), from float32 log-softmax
    whatever the compute dtype; the value and both gradients from one XLA program.

    Args:
      first_logits, second_logits: [..., vocab], the same positions of two passes.
      labels: int [...]; PAD_ID positions get weight 0.
    Returns:
      (divergence [...] float32, weights [...] float32 in {0, 1}).
    """
    @tf.custom_gradient
    def divergence_of(first, second):
        kl, first_gradient, second_gradient = _symmetric_kl_and_logits_gradients(first, second)

        def backward(upstream):
            upstream = upstream[..., None]
            return (tf.cast(first_gradient * upstream, first.dtype),
                    tf.cast(second_gradient * upstream, second.dtype))
        return kl, backward

    weights = _non_pad_weights(labels)
    return divergence_of(first_logits, second_logits) * weights, weights


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
