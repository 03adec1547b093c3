"""A model directory's model with its weights: restored, averaged (section 6.1) or cast.

`load_model` reads config.json once and builds the model from it; an averaged
directory (`write_averaged`: config, vocabulary and one weights-only
checkpoint) loads like any other.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np
import tensorflow as tf

from tf_transformer.config import Config
from tf_transformer.model_dir.layout import BEST, ModelDir


class LoadedModel(NamedTuple):
    config: Config
    model: tf.keras.Model
    paths: list[str]  # the checkpoints the weights come from


def load_model(model_dir: ModelDir, checkpoint: str | None = None, average_last: int = 0,
               build_model_fn: Callable | None = None, dtype: str = "float32",
               config: Config | None = None) -> LoadedModel:
    """The model of `model_dir`'s config.json with restored weights.

    `checkpoint` (a path, a directory, or "best": best/'s best) picks one
    checkpoint; `average_last=N` averages the last N of model_dir in memory
    (`average_into`), or with checkpoint="best" the N best; by default the
    latest checkpoint of model_dir. `dtype="bfloat16"`: an inference model
    whose weights are the restored ones rounded to bfloat16 (`cast_weights`).
    `config`: config.json as the caller has read it already (else read here).
    """
    if checkpoint and checkpoint != BEST and average_last:
        raise ValueError('give either a checkpoint or average_last (with "best" or none), '
                         "not both")
    if build_model_fn is None:
        from tf_transformer.model import build_model as build_model_fn
    config = config or model_dir.read_config()
    model = build_model_fn(config.model)
    if average_last:
        paths = (model_dir.best_checkpoints(average_last) if checkpoint == BEST
                 else model_dir.last_checkpoints(average_last))
        average_into(model, paths)
    else:
        paths = [model_dir.resolve(checkpoint)]
        tf.train.Checkpoint(model=model).restore(paths[0]).expect_partial() \
            .assert_existing_objects_matched()
    if dtype != "float32":
        model = cast_weights(model, build_model_fn(config.model, dtype=dtype))
    return LoadedModel(config, model, paths)


def cast_weights(model: tf.keras.Model, target: tf.keras.Model) -> tf.keras.Model:
    """`target` (the same architecture, built under another dtype policy) with
    `model`'s weights cast to its variables' dtypes; returns `target`."""
    pairs = list(zip(model.weights, target.weights))
    if len(model.weights) != len(target.weights) or any(
            a.path != b.path or a.shape != b.shape for a, b in pairs):
        raise ValueError("cast_weights needs two builds of the same architecture")
    for source, variable in pairs:
        variable.assign(tf.cast(source, variable.dtype))
    return target


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


def write_averaged(model_dir: ModelDir, num_last: int, output: ModelDir, build_model_fn,
                   checkpoint: str | None = None, config: Config | None = None) -> str:
    """Averages the last `num_last` checkpoints of `model_dir` (checkpoint="best": the
    `num_last` best) into the new model directory `output`; returns its checkpoint.

    The output holds config.json, the vocabularies and one weights-only
    checkpoint (numbered by the newest step averaged), so translate, evaluate
    and export accept it like a model_dir. `config`: config.json as the caller has
    read it already (else read here).
    """
    config, model, paths = load_model(model_dir, checkpoint, average_last=num_last,
                                      build_model_fn=build_model_fn, config=config)
    output.prepare(config, *model_dir.read_vocabularies())
    step = tf.Variable(max(int(p.rsplit("-", 1)[-1]) for p in paths), dtype=tf.int64)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model, step=step),
                                         output.path, max_to_keep=1, checkpoint_name="averaged")
    return manager.save(checkpoint_number=int(step.numpy()))
