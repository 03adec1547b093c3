"""`ModelDir`: every path of the model-directory contract, and its small files.

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
  .worker_<i>_scratch/ a non-chief worker's checkpoint writes, deleted after each
  input/worker_<i>/    each worker's input position at each checkpoint (training)
  best/                copies of the best checkpoints by dev score, `best.json`
                       (every evaluation, the kept ones best first) and an index
                       whose latest entry is the best
  train/, dev/         TensorBoard summaries
  init_from.json       a fine-tuned model's source: directory, checkpoint, step,
                       vocabulary kept or remapped (training/fine_tuning.py)

Training writes it (`prepare`, then checkpoints and best/); translation,
evaluation, averaging and the exporters read it (loading.py). No other module
joins a path onto a model directory (tests/test_model_dir.py reads every module's
AST).
"""

from __future__ import annotations

import json
import os

import tensorflow as tf

from tf_transformer.config import Config, ConfigError

CONFIG_FILE = "config.json"
VOCAB_FILE = "vocab.model"
SOURCE_VOCAB_FILE = "source_vocab.model"
TARGET_VOCAB_FILE = "target_vocab.model"
BEST_DIR = "best"
RECORD_FILE = "best.json"
INIT_FROM_FILE = "init_from.json"
INPUT_DIR = "input"
SUMMARY_DIRS = ("train", "dev")
BEST = "best"  # the --checkpoint value that names the best checkpoint(s)


class ModelDir:
    """The model directory at `path`.

    Every path of the contract comes from here; config.json, the vocabularies,
    best/'s record and init_from.json are read and written here (config.json and
    `prepare` on a local file system, as before; the rest through tf.io.gfile).
    """

    def __init__(self, path: str):
        self.path = path

    @classmethod
    def of(cls, model_dir: ModelDir | str) -> ModelDir:
        """`model_dir` itself, or the ModelDir of a path (a caller that takes either)."""
        return model_dir if isinstance(model_dir, ModelDir) else cls(model_dir)

    def __repr__(self) -> str:
        return f"ModelDir({self.path!r})"

    def __str__(self) -> str:
        return self.path

    def __eq__(self, other) -> bool:
        return isinstance(other, ModelDir) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    def _join(self, *names: str) -> str:
        return os.path.join(self.path, *names)

    # -- config.json ----------------------------------------------------------
    @property
    def config_path(self) -> str:
        return self._join(CONFIG_FILE)

    def is_model_dir(self) -> bool:
        """Whether the directory holds a config.json."""
        return os.path.exists(self.config_path)

    def read_config(self) -> Config:
        """config.json; ConfigError if there is none."""
        if not self.is_model_dir():
            raise ConfigError(f"{self.config_path} not found: is {self.path} a model directory?")
        with open(self.config_path) as f:
            return Config.from_json(f.read())

    def write_config(self, config: Config) -> str:
        """Replaces config.json atomically (a temporary file, then a rename); returns its path."""
        os.makedirs(self.path, exist_ok=True)
        tmp = self.config_path + ".tmp"
        with open(tmp, "w") as f:
            f.write(config.to_json())
        os.replace(tmp, self.config_path)
        return self.config_path

    # -- vocabularies ---------------------------------------------------------
    @property
    def shared_vocab_path(self) -> str:
        return self._join(VOCAB_FILE)

    @property
    def separate_vocab_paths(self) -> tuple[str, str]:
        """(source_vocab.model, target_vocab.model)."""
        return self._join(SOURCE_VOCAB_FILE), self._join(TARGET_VOCAB_FILE)

    def vocab_paths(self) -> tuple[str, str]:
        """(source, target) SentencePiece models: vocab.model twice when shared, else
        source_vocab.model and target_vocab.model; FileNotFoundError if none."""
        if tf.io.gfile.exists(self.shared_vocab_path):
            return self.shared_vocab_path, self.shared_vocab_path
        if all(tf.io.gfile.exists(path) for path in self.separate_vocab_paths):
            return self.separate_vocab_paths
        raise FileNotFoundError(f"{self.path} holds neither {VOCAB_FILE} nor {SOURCE_VOCAB_FILE} "
                                f"and {TARGET_VOCAB_FILE}: is it a model directory?")

    def has_vocabularies(self) -> bool:
        try:
            self.vocab_paths()
        except FileNotFoundError:
            return False
        return True

    def read_vocabularies(self) -> tuple[bytes, bytes | None]:
        """The serialized vocabularies as `prepare` takes them: (shared, None) or
        (source, target)."""
        protos = []
        for path in dict.fromkeys(self.vocab_paths()):
            with tf.io.gfile.GFile(path, "rb") as f:
                protos.append(f.read())
        return protos[0], (protos[1] if len(protos) > 1 else None)

    def prepare(self, config: Config, vocab_proto: bytes,
                target_vocab_proto: bytes | None = None) -> None:
        """Writes config and vocabulary, or refuses a directory made for another model.

        `vocab_proto` is the shared vocabulary (vocab.model), or with
        `target_vocab_proto` the source side's (source_vocab.model, then
        target_vocab.model; the model's embeddings must not be shared).
        A run resumed with a different architecture or vocabulary would restore
        mismatched weights or decode with the wrong pieces; both are refused here,
        with the difference named.
        """
        if target_vocab_proto is None:
            files = {self.shared_vocab_path: vocab_proto}
            other_kind = self.separate_vocab_paths
        else:
            if config.model.share_embeddings:
                raise ConfigError("separate source and target vocabularies need "
                                  "share_embeddings=False")
            files = dict(zip(self.separate_vocab_paths, (vocab_proto, target_vocab_proto)))
            other_kind = (self.shared_vocab_path,)
        for path in other_kind:
            if os.path.exists(path):
                kind = ("one shared vocabulary" if path == self.shared_vocab_path
                        else "separate vocabularies")
                raise ConfigError(f"{self.path} holds {os.path.basename(path)}: its model uses "
                                  f"{kind}; use another --model_dir")
        if self.is_model_dir():
            existing = self.read_config()
            if existing.model != config.model:
                diffs = {k: (getattr(existing.model, k), getattr(config.model, k))
                         for k in config.model.__dataclass_fields__
                         if getattr(existing.model, k) != getattr(config.model, k)}
                raise ConfigError(
                    f"{self.path} holds a model with a different architecture "
                    f"(existing, requested): {diffs}; use another --model_dir")
        for vocab_path, proto in files.items():
            if os.path.exists(vocab_path):
                with open(vocab_path, "rb") as f:
                    if f.read() != proto:
                        raise ConfigError(f"{self.path} was trained with another vocabulary "
                                          f"({vocab_path}); use another --model_dir")
        self.write_config(config)
        for vocab_path, proto in files.items():
            if not os.path.exists(vocab_path):
                tmp = vocab_path + ".tmp"
                with open(tmp, "wb") as f:
                    f.write(proto)
                os.replace(tmp, vocab_path)

    # -- checkpoints ----------------------------------------------------------
    def checkpoint_paths(self) -> list[str]:
        """All checkpoints the manager still keeps, oldest first."""
        state = tf.train.get_checkpoint_state(self.path)
        return list(state.all_model_checkpoint_paths) if state else []

    def latest_checkpoint(self) -> str | None:
        return tf.train.latest_checkpoint(self.path)

    def last_checkpoints(self, num_last: int) -> list[str]:
        """The newest `num_last` checkpoints kept; ValueError if fewer are kept."""
        paths = self.checkpoint_paths()[-num_last:]
        if len(paths) < num_last:
            raise ValueError(f"{self.path} keeps {len(paths)} checkpoints, fewer than "
                             f"{num_last} to average")
        return paths

    def resolve(self, checkpoint: str | None = None) -> str:
        """None -> the latest checkpoint; "best" -> best/'s best; a directory -> its
        latest checkpoint; a checkpoint path as it is. FileNotFoundError if none."""
        if checkpoint == BEST:
            try:
                return self.best_checkpoints(1)[0]
            except ValueError as error:
                raise FileNotFoundError(str(error)) from None
        path = checkpoint or self.path
        found = tf.train.latest_checkpoint(path) if tf.io.gfile.isdir(path) else path
        if not found:
            raise FileNotFoundError(f"no checkpoint in {path}")
        return found

    def named_checkpoint(self, name: str) -> str:
        """A checkpoint named inside the directory (`ckpt-300`)."""
        return self._join(name)

    def checkpoint_dir(self, worker_index: int, chief: bool) -> str:
        """Where a worker's checkpoint manager writes: the chief into the directory
        itself, other workers (which take part in every save) into a scratch
        directory they delete after each save."""
        return self.path if chief else self._join(f".worker_{worker_index}_scratch")

    # -- training's other state -----------------------------------------------
    def input_state_dir(self, worker_index: int) -> str:
        """input/worker_<i>/: worker i's input position at each checkpoint."""
        return self._join(INPUT_DIR, f"worker_{worker_index}")

    def summaries_dir(self, name: str) -> str:
        """train/ or dev/: TensorBoard summaries."""
        if name not in SUMMARY_DIRS:
            raise ValueError(f"summaries go to one of {SUMMARY_DIRS}, not {name!r}")
        return self._join(name)

    def write_init_from(self, record: dict) -> None:
        """init_from.json: where a fine-tuned model's first weights came from
        (fine_tuning.initialize's record), written through a temporary file and a rename."""
        path = self._join(INIT_FROM_FILE)
        tf.io.gfile.makedirs(self.path)
        _write_json(path, record)

    def read_init_from(self) -> dict | None:
        """init_from.json, or None for a model trained from scratch."""
        path = self._join(INIT_FROM_FILE)
        if not tf.io.gfile.exists(path):
            return None
        with tf.io.gfile.GFile(path) as f:
            return json.load(f)

    # -- best/: the record of the best checkpoints (training/selection.py decides) --
    @property
    def best_dir(self) -> str:
        return self._join(BEST_DIR)

    def read_record(self) -> dict:
        """best/best.json, or an empty record: {"metric", "evaluations", "best"}."""
        path = os.path.join(self.best_dir, RECORD_FILE)
        if not tf.io.gfile.exists(path):
            return {"metric": None, "evaluations": [], "best": []}
        with tf.io.gfile.GFile(path) as f:
            return json.load(f)

    def best_checkpoints(self, num_best: int = 1) -> list[str]:
        """Paths of the `num_best` best checkpoints, best first; ValueError if fewer are kept."""
        kept = self.read_record()["best"]
        if len(kept) < num_best:
            raise ValueError(f"{self.best_dir} keeps {len(kept)} best checkpoints, fewer than "
                             f"{num_best} (is --dev_data set in training?)")
        return [os.path.join(self.best_dir, entry["checkpoint"]) for entry in kept[:num_best]]

    def best_summary(self) -> str:
        """The done line's ' best=best/ckpt-N best_dev_bleu=X', or '' when none is kept."""
        record = self.read_record()
        return "".join(f" best={BEST_DIR}/{e['checkpoint']} best_{record['metric']}="
                       f"{e[record['metric']]:.4f}" for e in record["best"][:1])

    def write_record(self, record: dict, new_checkpoint: str | None = None) -> None:
        """Replaces best/'s record, ordered for crashes: `new_checkpoint`'s files are
        copied in first, then the record is replaced atomically, then the index is
        pointed at the best, then files the record no longer names are deleted."""
        directory = self.best_dir
        tf.io.gfile.makedirs(directory)
        if new_checkpoint:
            _copy_checkpoint(new_checkpoint, directory)
        _write_json(os.path.join(directory, RECORD_FILE), record)
        names = [e["checkpoint"] for e in record["best"]]
        if names:  # latest_checkpoint(best/) is the best one
            tf.compat.v1.train.update_checkpoint_state(
                directory, names[0], all_model_checkpoint_paths=names[::-1])
        kept = set(names)
        for path in tf.io.gfile.glob(os.path.join(directory, "*.index")) + \
                tf.io.gfile.glob(os.path.join(directory, "*.data-*")):
            if os.path.basename(path).split(".")[0] not in kept:
                tf.io.gfile.remove(path)


def _write_json(path: str, value: dict) -> None:
    """`value` as JSON at `path`, through a temporary file and a rename."""
    with tf.io.gfile.GFile(path + ".tmp", "w") as f:
        json.dump(value, f, indent=1)
    tf.io.gfile.rename(path + ".tmp", path, overwrite=True)


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
