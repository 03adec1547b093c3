"""The input and output TensorSpecs of the Translator's graph methods and the exported signatures.

Declared once, so the SavedModel's signatures are the Translator's functions'.
"""

import tensorflow as tf

TEXT = tf.TensorSpec([None], tf.string, name="text")  # [B] UTF-8 sentences
IDS = tf.TensorSpec([None, None], tf.int32, name="source_ids")  # [B, S]: tokens, EOS, PAD
OUT_IDS = tf.TensorSpec([None, None], tf.int32, name="ids")  # [B, T] target ids to detokenize
ALPHA = tf.TensorSpec([], tf.float32, name="alpha")  # length penalty; negative: the default
EXTRA = tf.TensorSpec([], tf.int32, name="extra_length")  # max output = source + this
# Scoring: pairs of sentences, and the target side as ids (tokens, then EOS or PAD).
SOURCE = tf.TensorSpec([None], tf.string, name="source")  # [B] UTF-8 sources
TARGET = tf.TensorSpec([None], tf.string, name="target")  # [B] UTF-8 targets
TARGET_IDS = tf.TensorSpec([None, None], tf.int32, name="target_ids")  # [B, T]
# Target prefixes: [B] UTF-8 starts of the outputs, "" for none (search/prefix.py).
PREFIX = tf.TensorSpec([None], tf.string, name="prefix")
# Sampling settings; zero or negative: off (top-k, top-p) or the default (temperature 1).
TOPK = tf.TensorSpec([], tf.int32, name="sampling_topk")
TOPP = tf.TensorSpec([], tf.float32, name="sampling_topp")
TEMPERATURE = tf.TensorSpec([], tf.float32, name="sampling_temperature")
SEED = tf.TensorSpec([], tf.int64, name="seed")  # of the stateless draws
