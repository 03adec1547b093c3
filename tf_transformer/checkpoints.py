"""Checkpoints: the model-directory contract, and averaging of the last N.

Writes go through tf.train.CheckpointManager: TensorFlow writes each
checkpoint's files first and then replaces the small `checkpoint` index file
atomically, so a crash during a write leaves the previous checkpoint the one
that is restored.
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from tf_transformer.config import Config, ConfigError

VOCAB_FILE = "vocab.model"


def checkpoint_paths(model_dir: str) -> list[str]:
    """All checkpoints the manager still keeps, oldest first."""
    state = tf.train.get_checkpoint_state(model_dir)
    return list(state.all_model_checkpoint_paths) if state else []


def latest(model_dir: str) -> str | None:
    return tf.train.latest_checkpoint(model_dir)


def prepare_model_dir(model_dir: str, config: Config, vocab_proto: bytes) -> None:
    """Writes config and vocabulary, or refuses a directory made for another model.

    A run resumed with a different architecture or vocabulary would restore
    mismatched weights or decode with the wrong pieces; both are refused here,
    with the difference named.
    """
    config_path = os.path.join(model_dir, "config.json")
    vocab_path = os.path.join(model_dir, VOCAB_FILE)
    if os.path.exists(config_path):
        existing = Config.load(model_dir)
        if existing.model != config.model:
            diffs = {k: (getattr(existing.model, k), getattr(config.model, k))
                     for k in config.model.__dataclass_fields__
                     if getattr(existing.model, k) != getattr(config.model, k)}
            raise ConfigError(
                f"{model_dir} holds a model with a different architecture "
                f"(existing, requested): {diffs}; use another --model_dir")
    if os.path.exists(vocab_path):
        with open(vocab_path, "rb") as f:
            if f.read() != vocab_proto:
                raise ConfigError(f"{model_dir} was trained with another vocabulary "
                                  f"({vocab_path}); use another --model_dir")
    os.makedirs(model_dir, exist_ok=True)
    config.save(model_dir)
    if not os.path.exists(vocab_path):
        tmp = vocab_path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(vocab_proto)
        os.replace(tmp, vocab_path)


def average_into(model: tf.keras.Model, paths: list[str]) -> None:
    """Sets the model's weights to the arithmetic mean of the given checkpoints.

    Averaging happens in float64 over the model's own variables, restored one
    checkpoint at a time, so memory holds one extra copy of the weights.
    """
    if not paths:
        raise ValueError("no checkpoints to average")
    total = [np.zeros(v.shape, np.float64) for v in model.weights]
    for path in paths:
        tf.train.Checkpoint(model=model).restore(path).expect_partial().assert_existing_objects_matched()
        for acc, var in zip(total, model.weights):
            acc += var.numpy().astype(np.float64)
    for acc, var in zip(total, model.weights):
        var.assign((acc / len(paths)).astype(var.dtype))


def write_averaged(model_dir: str, num_last: int, output_dir: str, build_model_fn) -> str:
    """Averages the last `num_last` checkpoints of `model_dir` into a new model directory.

    The output holds config.json, the vocabulary and one weights-only
    checkpoint, so translate, evaluate and export accept it like a model_dir.
    """
    paths = checkpoint_paths(model_dir)[-num_last:]
    if len(paths) < num_last:
        raise ValueError(f"{model_dir} keeps {len(paths)} checkpoints, fewer than --num_last={num_last}")
    config = Config.load(model_dir)
    model = build_model_fn(config.model)
    average_into(model, paths)
    with open(os.path.join(model_dir, VOCAB_FILE), "rb") as f:
        prepare_model_dir(output_dir, config, f.read())
    step = tf.Variable(int(paths[-1].rsplit("-", 1)[-1]), dtype=tf.int64)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model, step=step), output_dir,
                                         max_to_keep=1, checkpoint_name="averaged")
    return manager.save(checkpoint_number=int(step.numpy()))
