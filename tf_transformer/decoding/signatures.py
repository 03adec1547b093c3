"""The input and output TensorSpecs of the Translator's graph methods and the exported signatures.

Declared once, so the SavedModel's signatures are the Translator's functions'.
"""

import tensorflow as tf

TEXT = tf.TensorSpec([None], tf.string, name="text")  # [B] UTF-8 sentences
IDS = tf.TensorSpec([None, None], tf.int32, name="source_ids")  # [B, S]: tokens, EOS, PAD
OUT_IDS = tf.TensorSpec([None, None], tf.int32, name="ids")  # [B, T] target ids to detokenize
ALPHA = tf.TensorSpec([], tf.float32, name="alpha")  # length penalty; negative: the default
EXTRA = tf.TensorSpec([], tf.int32, name="extra_length")  # max output = source + this
