"""The model directory: the one place a trained model lives.

MODEL_DIR/
  config.json          the frozen Config (config.py): every hyperparameter
  vocab.model          the SentencePiece model both sides are tokenized with, or
  source_vocab.model,  with separate vocabularies (share_embeddings off) the
  target_vocab.model   source side's and the target side's instead
  checkpoint, ckpt-N.* TensorFlow's checkpoint index and the kept checkpoints
                       (weights, optimizer; the trainer's, written through
                       tf.train.CheckpointManager: a checkpoint's files first,
                       then the small index replaced atomically, so a crash
                       during a write leaves the previous checkpoint the one
                       restored)
  input/worker_<i>/    each worker's input position at each checkpoint (training)
  best/                copies of the best checkpoints by dev score, `best.json`
                       (every evaluation, the kept ones best first) and an index
                       whose latest entry is the best
  train/, dev/         TensorBoard summaries
  init_from.json       a fine-tuned model's source: directory, checkpoint, step,
                       vocabulary kept or remapped (fine_tuning.py)

Training writes it (`prepare_model_dir`, then checkpoints and best/);
translation, evaluation, averaging and the exporters read it (`load_model`).
An averaged directory (`write_averaged`) holds config, vocabulary and one
weights-only checkpoint, and loads like any other.
"""

from __future__ import annotations

import json
import os
from typing import Callable, NamedTuple

import numpy as np
import tensorflow as tf

from tf_transformer.config import Config, ConfigError

VOCAB_FILE = "vocab.model"
SOURCE_VOCAB_FILE = "source_vocab.model"
TARGET_VOCAB_FILE = "target_vocab.model"
BEST_DIR = "best"
RECORD_FILE = "best.json"
INIT_FROM_FILE = "init_from.json"
BEST = "best"  # the --checkpoint value that names the best checkpoint(s)


def checkpoint_paths(model_dir: str) -> list[str]:
    """All checkpoints the manager still keeps, oldest first."""
    state = tf.train.get_checkpoint_state(model_dir)
    return list(state.all_model_checkpoint_paths) if state else []


def resolve(path: str, model_dir: str | None = None) -> str:
    """A checkpoint path, or a directory -> its latest checkpoint, or "best" -> the best
    checkpoint of `model_dir` (selection.py); FileNotFoundError if none."""
    if path == BEST:
        if model_dir is None:
            raise ValueError('checkpoint "best" needs the model_dir')
        try:
            return best_checkpoints(model_dir, 1)[0]
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
               build_model_fn: Callable | None = None, dtype: str = "float32") -> LoadedModel:
    """The model of `model_dir`/config.json with restored weights.

    `checkpoint` (a path, a directory, or "best": model_dir/best/'s best) picks
    one checkpoint; `average_last=N` averages the last N of model_dir in memory
    (`average_into`), or with checkpoint="best" the N best; by default the
    latest checkpoint of model_dir. An averaged directory (`write_averaged`)
    loads like any model directory. `dtype="bfloat16"`: an inference model
    whose weights are the restored ones rounded to bfloat16 (`cast_weights`).
    """
    if checkpoint and checkpoint != BEST and average_last:
        raise ValueError('give either a checkpoint or average_last (with "best" or none), '
                         "not both")
    if build_model_fn is None:
        from tf_transformer.model import build_model as build_model_fn
    config = Config.load(model_dir)
    model = build_model_fn(config.model)
    if average_last:
        paths = (best_checkpoints(model_dir, average_last)
                 if checkpoint == BEST else last_checkpoints(model_dir, average_last))
        average_into(model, paths)
    else:
        paths = [resolve(checkpoint or model_dir, model_dir)]
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


def last_checkpoints(model_dir: str, num_last: int) -> list[str]:
    """The newest `num_last` checkpoints kept in model_dir; ValueError if fewer are kept."""
    paths = checkpoint_paths(model_dir)[-num_last:]
    if len(paths) < num_last:
        raise ValueError(f"{model_dir} keeps {len(paths)} checkpoints, fewer than {num_last} "
                         "to average")
    return paths


def vocab_paths(model_dir: str) -> tuple[str, str]:
    """(source, target) SentencePiece models of `model_dir`: vocab.model twice when
    shared, else source_vocab.model and target_vocab.model; FileNotFoundError if none."""
    shared = os.path.join(model_dir, VOCAB_FILE)
    if tf.io.gfile.exists(shared):
        return shared, shared
    separate = (os.path.join(model_dir, SOURCE_VOCAB_FILE),
                os.path.join(model_dir, TARGET_VOCAB_FILE))
    if all(tf.io.gfile.exists(path) for path in separate):
        return separate
    raise FileNotFoundError(f"{model_dir} holds neither {VOCAB_FILE} nor {SOURCE_VOCAB_FILE} and "
                            f"{TARGET_VOCAB_FILE}: is it a model directory?")


def read_vocabularies(model_dir: str) -> tuple[bytes, bytes | None]:
    """The serialized vocabularies as prepare_model_dir takes them: (shared, None) or
    (source, target)."""
    source, target = vocab_paths(model_dir)
    protos = []
    for path in dict.fromkeys((source, target)):
        with tf.io.gfile.GFile(path, "rb") as f:
            protos.append(f.read())
    return protos[0], (protos[1] if len(protos) > 1 else None)


def prepare_model_dir(model_dir: str, config: Config, vocab_proto: bytes,
                      target_vocab_proto: bytes | None = None) -> None:
    """Writes config and vocabulary, or refuses a directory made for another model.

    `vocab_proto` is the shared vocabulary (vocab.model), or with
    `target_vocab_proto` the source side's (source_vocab.model, then
    target_vocab.model; the model's embeddings must not be shared).
    A run resumed with a different architecture or vocabulary would restore
    mismatched weights or decode with the wrong pieces; both are refused here,
    with the difference named.
    """
    config_path = os.path.join(model_dir, "config.json")
    if target_vocab_proto is None:
        files = {VOCAB_FILE: vocab_proto}
        other_kind = (SOURCE_VOCAB_FILE, TARGET_VOCAB_FILE)
    else:
        if config.model.share_embeddings:
            raise ConfigError("separate source and target vocabularies need "
                              "share_embeddings=False")
        files = {SOURCE_VOCAB_FILE: vocab_proto, TARGET_VOCAB_FILE: target_vocab_proto}
        other_kind = (VOCAB_FILE,)
    for name in other_kind:
        if os.path.exists(os.path.join(model_dir, name)):
            kind = "one shared vocabulary" if name == VOCAB_FILE else "separate vocabularies"
            raise ConfigError(f"{model_dir} holds {name}: its model uses {kind}; "
                              "use another --model_dir")
    if os.path.exists(config_path):
        existing = Config.load(model_dir)
        if existing.model != config.model:
            diffs = {k: (getattr(existing.model, k), getattr(config.model, k))
                     for k in config.model.__dataclass_fields__
                     if getattr(existing.model, k) != getattr(config.model, k)}
            raise ConfigError(
                f"{model_dir} holds a model with a different architecture "
                f"(existing, requested): {diffs}; use another --model_dir")
    for name, proto in files.items():
        vocab_path = os.path.join(model_dir, name)
        if os.path.exists(vocab_path):
            with open(vocab_path, "rb") as f:
                if f.read() != proto:
                    raise ConfigError(f"{model_dir} was trained with another vocabulary "
                                      f"({vocab_path}); use another --model_dir")
    os.makedirs(model_dir, exist_ok=True)
    config.save(model_dir)
    for name, proto in files.items():
        vocab_path = os.path.join(model_dir, name)
        if not os.path.exists(vocab_path):
            tmp = vocab_path + ".tmp"
            with open(tmp, "wb") as f:
                f.write(proto)
            os.replace(tmp, vocab_path)


def write_init_from(model_dir: str, record: dict) -> None:
    """MODEL_DIR/init_from.json: where a fine-tuned model's first weights came from
    (fine_tuning.initialize's record), written through a temporary file and a rename."""
    path = os.path.join(model_dir, INIT_FROM_FILE)
    tf.io.gfile.makedirs(model_dir)
    with tf.io.gfile.GFile(path + ".tmp", "w") as f:
        json.dump(record, f, indent=1)
    tf.io.gfile.rename(path + ".tmp", path, overwrite=True)


def read_init_from(model_dir: str) -> dict | None:
    """MODEL_DIR/init_from.json, or None for a model trained from scratch."""
    path = os.path.join(model_dir, INIT_FROM_FILE)
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as f:
        return json.load(f)


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

    The output holds config.json, the vocabularies and one weights-only
    checkpoint (numbered by the newest step averaged), so translate, evaluate
    and export accept it like a model_dir.
    """
    config, model, paths = load_model(model_dir, checkpoint, average_last=num_last,
                                      build_model_fn=build_model_fn)
    prepare_model_dir(output_dir, config, *read_vocabularies(model_dir))
    step = tf.Variable(max(int(p.rsplit("-", 1)[-1]) for p in paths), dtype=tf.int64)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model, step=step), output_dir,
                                         max_to_keep=1, checkpoint_name="averaged")
    return manager.save(checkpoint_number=int(step.numpy()))


# -- best/: the record of the best checkpoints (training/selection.py decides) ----
def read_record(model_dir: str) -> dict:
    """MODEL_DIR/best/best.json, or an empty record: {"metric", "evaluations", "best"}."""
    path = os.path.join(model_dir, BEST_DIR, RECORD_FILE)
    if not tf.io.gfile.exists(path):
        return {"metric": None, "evaluations": [], "best": []}
    with tf.io.gfile.GFile(path) as f:
        return json.load(f)


def best_checkpoints(model_dir: str, num_best: int = 1) -> list[str]:
    """Paths of the `num_best` best checkpoints, best first; ValueError if fewer are kept."""
    kept = read_record(model_dir)["best"]
    if len(kept) < num_best:
        raise ValueError(f"{os.path.join(model_dir, BEST_DIR)} keeps {len(kept)} best "
                         f"checkpoints, fewer than {num_best} (is --dev_data set in training?)")
    return [os.path.join(model_dir, BEST_DIR, entry["checkpoint"]) for entry in kept[:num_best]]


def best_summary(model_dir: str) -> str:
    """The done line's ' best=best/ckpt-N best_dev_bleu=X', or '' when none is kept."""
    record = read_record(model_dir)
    return "".join(f" best={BEST_DIR}/{e['checkpoint']} best_{record['metric']}="
                   f"{e[record['metric']]:.4f}" for e in record["best"][:1])


def write_record(model_dir: str, record: dict, new_checkpoint: str | None = None) -> None:
    """Replaces best/'s record, ordered for crashes: `new_checkpoint`'s files are
    copied in first, then the record is replaced atomically, then the index is
    pointed at the best, then files the record no longer names are deleted."""
    directory = os.path.join(model_dir, BEST_DIR)
    tf.io.gfile.makedirs(directory)
    if new_checkpoint:
        _copy_checkpoint(new_checkpoint, directory)
    path = os.path.join(directory, RECORD_FILE)
    with tf.io.gfile.GFile(path + ".tmp", "w") as f:
        json.dump(record, f, indent=1)
    tf.io.gfile.rename(path + ".tmp", path, overwrite=True)
    names = [e["checkpoint"] for e in record["best"]]
    if names:  # latest_checkpoint(best/) is the best one
        tf.compat.v1.train.update_checkpoint_state(
            directory, names[0], all_model_checkpoint_paths=names[::-1])
    kept = set(names)
    for path in tf.io.gfile.glob(os.path.join(directory, "*.index")) + \
            tf.io.gfile.glob(os.path.join(directory, "*.data-*")):
        if os.path.basename(path).split(".")[0] not in kept:
            tf.io.gfile.remove(path)


def _copy_checkpoint(prefix: str, directory: str) -> str:
    """Copies the files of checkpoint `prefix` (index, data shards) into `directory`."""
    name = os.path.basename(prefix)
    files = tf.io.gfile.glob(prefix + ".*")
    if not files:
        raise FileNotFoundError(f"no files for checkpoint {prefix}")
    for path in files:
        target = os.path.join(directory, os.path.basename(path))
        tf.io.gfile.copy(path, target + ".tmp", overwrite=True)
        tf.io.gfile.rename(target + ".tmp", target, overwrite=True)
    return name
