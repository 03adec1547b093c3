"""Checkpoints: the model-directory contract, and averaging of the last or best N.

Writes go through tf.train.CheckpointManager: TensorFlow writes each
checkpoint's files first and then replaces the small `checkpoint` index file
atomically, so a crash during a write leaves the previous checkpoint the one
that is restored.
"""

from __future__ import annotations

import os
from typing import Callable, NamedTuple

import numpy as np
import tensorflow as tf

from tf_transformer.config import Config, ConfigError
from tf_transformer.training import selection

VOCAB_FILE = "vocab.model"


def checkpoint_paths(model_dir: str) -> list[str]:
    """All checkpoints the manager still keeps, oldest first."""
    state = tf.train.get_checkpoint_state(model_dir)
    return list(state.all_model_checkpoint_paths) if state else []


def resolve(path: str, model_dir: str | None = None) -> str:
    """A checkpoint path, or a directory -> its latest checkpoint, or "best" -> the best
    checkpoint of `model_dir` (selection.py); FileNotFoundError if none."""
    if path == selection.BEST:
        if model_dir is None:
            raise ValueError('checkpoint "best" needs the model_dir')
        try:
            return selection.best_checkpoints(model_dir, 1)[0]
        except ValueError as error:
            raise FileNotFoundError(str(error)) from None
    found = tf.train.latest_checkpoint(path) if tf.io.gfile.isdir(path) else path
    if not found:
        raise FileNotFoundError(f"no checkpoint in {path}")
    return found


class LoadedModel(NamedTuple):
    config: Config
    model: tf.keras.Model
    paths: list[str]  # the checkpoints the weights come from


def load_model(model_dir: str, checkpoint: str | None = None, average_last: int = 0,
               build_model_fn: Callable | None = None) -> LoadedModel:
    """The model of `model_dir`/config.json with restored weights.

    `checkpoint` (a path, a directory, or "best": model_dir/best/'s best) picks
    one checkpoint; `average_last=N` averages the last N of model_dir in memory
    (`average_into`), or with checkpoint="best" the N best; by default the
    latest checkpoint of model_dir. An averaged directory (`write_averaged`)
    loads like any model directory.
    """
    if checkpoint and checkpoint != selection.BEST and average_last:
        raise ValueError('give either a checkpoint or average_last (with "best" or none), '
                         "not both")
    if build_model_fn is None:
        from tf_transformer.model import build_model as build_model_fn
    config = Config.load(model_dir)
    model = build_model_fn(config.model)
    if average_last:
        paths = (selection.best_checkpoints(model_dir, average_last)
                 if checkpoint == selection.BEST else last_checkpoints(model_dir, average_last))
        average_into(model, paths)
        return LoadedModel(config, model, paths)
    path = resolve(checkpoint or model_dir, model_dir)
    tf.train.Checkpoint(model=model).restore(path).expect_partial() \
        .assert_existing_objects_matched()
    return LoadedModel(config, model, [path])


def last_checkpoints(model_dir: str, num_last: int) -> list[str]:
    """The newest `num_last` checkpoints kept in model_dir; ValueError if fewer are kept."""
    paths = checkpoint_paths(model_dir)[-num_last:]
    if len(paths) < num_last:
        raise ValueError(f"{model_dir} keeps {len(paths)} checkpoints, fewer than {num_last} "
                         "to average")
    return paths


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


def write_averaged(model_dir: str, num_last: int, output_dir: str, build_model_fn,
                   checkpoint: str | None = None) -> str:
    """Averages the last `num_last` checkpoints of `model_dir` (checkpoint="best": the
    `num_last` best) into a new model directory.

    The output holds config.json, the vocabulary and one weights-only
    checkpoint (numbered by the newest step averaged), so translate, evaluate
    and export accept it like a model_dir.
    """
    config, model, paths = load_model(model_dir, checkpoint, average_last=num_last,
                                      build_model_fn=build_model_fn)
    with open(os.path.join(model_dir, VOCAB_FILE), "rb") as f:
        prepare_model_dir(output_dir, config, f.read())
    step = tf.Variable(max(int(p.rsplit("-", 1)[-1]) for p in paths), dtype=tf.int64)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model, step=step), output_dir,
                                         max_to_keep=1, checkpoint_name="averaged")
    return manager.save(checkpoint_number=int(step.numpy()))
