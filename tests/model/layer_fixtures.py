"""A tiny model configuration and a random batch for the model tests (tests/model/)."""

import numpy as np
import tensorflow as tf

from tf_transformer.config import BOS_ID, ModelConfig

TINY = ModelConfig(vocab_size=40, num_layers=2, d_model=32, d_ff=64, num_heads=4, dropout=0.0)


def random_batch(batch=2, s=7, t=8) -> tuple[tf.Tensor, tf.Tensor]:
    """(source int32 [batch, s], target_in int32 [batch, t]): seeded ids of TINY's vocabulary,
    targets starting with BOS, row 1's source padded after 4 tokens."""
    rng = np.random.default_rng(0)
    source = rng.integers(4, 40, size=(batch, s))
    target = rng.integers(4, 40, size=(batch, t))
    target[:, 0] = BOS_ID
    source[1, 4:] = 0  # a shorter source
    return tf.constant(source, tf.int32), tf.constant(target, tf.int32)
