"""Fine-tuning: a new model directory that starts from a trained model's weights.

`python -m tf_transformer.train --init_from=MODEL_DIR[:CHECKPOINT] --model_dir=NEW_DIR`
builds NEW_DIR's model (the source's architecture, flags.fine_tuning_config)
with a fresh optimizer at step 0, so the schedule warms up again, then
`initialize` sets its weights to the source checkpoint's, once: train.py calls it
only while NEW_DIR holds no checkpoint, so rerunning the command resumes NEW_DIR.

Vocabulary update: with another SentencePiece model than the source's, the one
embedding table (source, target and the pre-softmax projection, section 3.4)
is remapped by piece string, not by id: a piece both vocabularies hold keeps
its row, a new piece keeps the fresh row the new model was built with (its
initializer's), a dropped piece's row is discarded, and the special ids
0..EOS_ID keep their rows. Every other weight is copied as it is.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from tf_transformer.config import EOS_ID, ConfigError
from tf_transformer.inputs.tokenizer import Tokenizer
from tf_transformer.model_dir import BEST, ModelDir, load_model


def source_checkpoint(model_dir: ModelDir, checkpoint: str | None = None) -> str:
    """The checkpoint CHECKPOINT of --init_from=MODEL_DIR[:CHECKPOINT] names: the latest
    (None), "best" (ModelDir.resolve), a path, or a name inside MODEL_DIR (ckpt-300)."""
    if checkpoint and checkpoint != BEST and not _exists(checkpoint):
        inside = model_dir.named_checkpoint(checkpoint)
        if _exists(inside):
            checkpoint = inside
    path = model_dir.resolve(checkpoint)
    if not _exists(path):
        raise FileNotFoundError(f"no checkpoint {checkpoint} in {model_dir} nor at that path")
    return path


def _exists(path: str) -> bool:
    return tf.io.gfile.isdir(path) or tf.io.gfile.exists(path + ".index")


def pieces(vocab_proto: bytes) -> list[bytes]:
    """The pieces of a SentencePiece model, by id."""
    tokenizer = Tokenizer(vocab_proto)
    return list(tokenizer.id_to_piece(tf.range(tokenizer.vocab_size)).numpy())


def piece_map(old_pieces: Sequence[bytes], new_pieces: Sequence[bytes]) -> np.ndarray:
    """int64 [new vocab]: each new id's old id (the same piece), -1 where the old
    vocabulary lacks the piece; ids 0..EOS_ID (pad, unk, BOS, EOS) map to themselves."""
    old_ids = {piece: i for i, piece in enumerate(old_pieces)}
    mapping = np.array([old_ids.get(piece, -1) for piece in new_pieces], np.int64)
    mapping[:EOS_ID + 1] = np.arange(EOS_ID + 1)
    return mapping


def remap_rows(old_table: np.ndarray, fresh_table: np.ndarray,
               mapping: np.ndarray) -> np.ndarray:
    """[new vocab, d_model]: old_table's row mapping[i] where mapping[i] >= 0, else
    fresh_table's row i (old_table [old vocab, d_model], fresh_table [new vocab, d_model])."""
    kept = (mapping >= 0)[:, None]
    return np.where(kept, old_table[np.maximum(mapping, 0)], fresh_table)


def initialize(model: tf.keras.Model, source_dir: ModelDir, checkpoint: str | None,
               vocab_proto: bytes | None) -> dict:
    """Sets `model`'s weights to the checkpoint of `source_dir` (`source_checkpoint`).

    `model`: a fresh build of the source's architecture whose shared vocabulary is
    `vocab_proto`, or None for the source's own vocabularies, kept as they are (a
    model with separate ones); call inside its distribution strategy's scope.
    Returns the record of where the weights came from (ModelDir.write_init_from).
    """
    path = source_checkpoint(source_dir, checkpoint)
    source = load_model(source_dir, path)
    record = {"model_dir": os.path.abspath(source_dir.path), "checkpoint": os.path.abspath(path),
              "step": _step(path), "vocabulary": "source"}
    mapping = None
    source_proto = vocab_proto
    if vocab_proto is not None:
        with tf.io.gfile.GFile(source_dir.shared_vocab_path, "rb") as f:
            source_proto = f.read()
    if source_proto != vocab_proto:
        if not source.config.model.share_embeddings:
            raise ConfigError("a new vocabulary is remapped into the shared embedding only; "
                              f"{source_dir} has separate source and target embeddings")
        old_pieces = pieces(source_proto)
        mapping = piece_map(old_pieces, pieces(vocab_proto))
        kept = int(np.sum(mapping[EOS_ID + 1:] >= 0))
        record.update(vocabulary="updated", pieces_kept=kept,
                      pieces_new=int(np.sum(mapping < 0)),
                      pieces_dropped=len(old_pieces) - (EOS_ID + 1) - kept)
    table = model.target_embedding.token_embedding.embeddings.path
    if len(source.model.weights) != len(model.weights):
        raise ConfigError(f"{source_dir}'s model has another architecture than the one to "
                          "initialize")
    for old, new in zip(source.model.weights, model.weights):
        value = old.numpy()
        if old.path != new.path:
            raise ConfigError(f"weights differ: {old.path} in {source_dir}, {new.path} here")
        if new.path == table and mapping is not None:
            value = remap_rows(value, new.numpy(), mapping)
        if tuple(value.shape) != tuple(new.shape):
            raise ConfigError(f"{new.path}: shape {tuple(old.shape)} in {source_dir}, "
                              f"{tuple(new.shape)} here")
        new.assign(value)
    return record


def start(model: tf.keras.Model, model_dir: ModelDir, source_dir: ModelDir,
          checkpoint: str | None, vocab_proto: bytes | None,
          write_record: bool = True) -> dict | None:
    """`initialize`s the model of a new fine-tuned `model_dir` and (`write_record`: the
    chief) writes the record to model_dir/init_from.json; returns the record. Nothing (None)
    once model_dir holds a checkpoint: that directory resumes, it is never re-initialised."""
    if model_dir.checkpoint_paths():
        return None
    record = initialize(model, source_dir, checkpoint, vocab_proto)
    if write_record:
        model_dir.write_init_from(record)
    return record


def _step(path: str) -> int | None:
    """The global step in a checkpoint's name (ckpt-300, averaged-300), if any."""
    number = os.path.basename(path).rsplit("-", 1)[-1]
    return int(number) if number.isdigit() else None
