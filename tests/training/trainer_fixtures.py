"""Shared by the trainer tests: a tiny model, random batches, a repeating dataset, the
weights to compare, and TensorBoard scalars read back."""

import os

import numpy as np
import tensorflow as tf

from tf_transformer.config import BOS_ID, EOS_ID, Config, ModelConfig, TrainConfig

MODEL = ModelConfig(vocab_size=30, num_layers=1, d_model=16, d_ff=32, num_heads=2, dropout=0.0)


def train_config(**train):
    return Config(model=MODEL, train=TrainConfig(**{"warmup_steps": 10, "log_every": 1,
                                                     "checkpoint_minutes": 1e9, **train}))


def random_batch(seed, batch, length):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, length + 1, size=batch)
    lengths[0] = length
    source = np.zeros((batch, length), np.int32)
    target = np.zeros((batch, length), np.int32)
    for i, n in enumerate(lengths):
        source[i, :n] = rng.integers(4, 30, size=n)
        target[i, :n] = rng.integers(4, 30, size=n)
    target_in = np.concatenate([np.full((batch, 1), BOS_ID), target[:, :-1]], 1) * (target > 0)
    target_in[:, 0] = BOS_ID
    target_out = target.copy()
    target_out[np.arange(batch), lengths - 1] = EOS_ID
    return {"source": source, "target_in": target_in.astype(np.int32), "target_out": target_out}


def pad_batch(batch, length):
    return {k: np.pad(v, [(0, 0), (0, length - v.shape[1])]) for k, v in batch.items()}


def concat_batches(a, b):
    length = max(a["source"].shape[1], b["source"].shape[1])
    a, b = pad_batch(a, length), pad_batch(b, length)
    return {k: np.concatenate([a[k], b[k]]) for k in a}


def without_autotune(dataset):
    """`dataset` without tf.data's autotuning, which has nothing to tune in a dataset of
    constant batches: its model thread waits out its optimization period (seconds,
    growing with the iterator's age up to a minute) when the iterator is deleted, so a
    dropped trainer (a module fixture's at teardown) could hold a test that long."""
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


def dataset_of(batches):
    """A repeating dataset of the given batches (tf.data can save its position)."""
    def for_start(start_step):
        assert start_step == 0  # the trainer restores the saved position
        def fn(input_context):
            del input_context
            ds = tf.data.Dataset.from_tensors(batches[0])
            for batch in batches[1:]:
                ds = ds.concatenate(tf.data.Dataset.from_tensors(batch))
            return without_autotune(ds.repeat())
        return fn
    return for_start


# Three steps, each of two batches: two replicas' (or micro-batches') halves of one step.
STEPS = [(random_batch(2 * i, 3, 5 + i), random_batch(2 * i + 1, 2, 7 - i)) for i in range(3)]


def weights_but_key_biases(trainer):
    """All weights but the key biases of attention: softmax is invariant to them, so
    their true gradient is exactly 0 and Adam turns rounding noise into updates."""
    weights = []
    for v in trainer.model.weights:
        value = v.numpy()
        hk = MODEL.num_heads * MODEL.key_dim
        if v.path.endswith("self_attention/qkv_bias"):
            value = np.concatenate([value[:hk], value[2 * hk:]])
        if v.path.endswith("cross_attention/key_value_bias"):
            value = value[hk:]
        weights.append(value)
    return weights


def read_scalars(logdir, skip=()):
    """{tag: {step: value}} of every scalar summary in the event files of `logdir`, but
    those named in `skip`."""
    scalars = {}
    for name in sorted(set(os.listdir(logdir)) - set(skip)):
        for event in tf.compat.v1.train.summary_iterator(os.path.join(logdir, name)):
            for value in event.summary.value:
                scalars.setdefault(value.tag, {})[event.step] = float(
                    tf.make_ndarray(value.tensor))
    return scalars
