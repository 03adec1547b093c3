"""Export of the Translator as a TF Serving SavedModel (`python -m export`).

Layout: EXPORT_DIR/<version>/ with saved_model.pb, variables/, assets/
(vocab.model, export_metadata.json) and assets.extra/tf_serving_warmup_requests.
Versions are integers; each export takes the next one and never reuses a number
(EXPORT_DIR/.last_version remembers the highest ever issued, so a deleted
version is not handed out again). The version is written under a temporary
name beside it (".tmp-<version>", which TF Serving ignores: not an integer)
and renamed into place, so a server never sees half an export.

The graph is the Translator's (the same tf.functions the translate binary
runs), wrapped by `ServingModule` into signatures:

  serving_default  text string [B] -> translation string [B], score float32 [B]
  translate        text [B], alpha float32 [], extra_length int32 [] (negative:
                   the baked-in value) -> translation [B], score [B], length int32 [B]
  translate_nbest  text [B] -> translations string [B, nbest], scores float32
                   [B, nbest], lengths int32 [B, nbest], best first
  translate_ids    source_ids int32 [B, S] (tokens, EOS, PAD=0 after) ->
                   ids int32 [B, nbest, T], scores float32 [B, nbest], lengths int32 [B, nbest]
  tokenize         text [B] -> source_ids int32 [B, S] (as translate prepares them)
  detokenize       ids int32 [B, T] -> text string [B] (stops at EOS, drops PAD/BOS)

SentencePiece: tensorflow-text's SentencepieceOp takes the serialized model as
an op *attribute*, so the graph carries its own copy of the vocabulary; the
same file is also shipped as the asset assets/vocab.model (for clients that
tokenize themselves, and for operators) and `export_metadata.json` records its
SHA-256. `embedded_sentencepiece_models` reads the copy out of the graph, so a
test can check both are the same bytes.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import shutil
import tempfile
from typing import Sequence

import tensorflow as tf
from absl import logging

from tf_transformer import checkpoints
from tf_transformer.config import Config, DecodeConfig
from tf_transformer.model import build_model
from tf_transformer.tokenizer import Tokenizer
from tf_transformer.translator import LENGTH_BUCKET, Translator

METADATA_FILE = "export_metadata.json"
WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
LAST_VERSION_FILE = ".last_version"
TMP_PREFIX = ".tmp-"

_TEXT = tf.TensorSpec([None], tf.string, name="text")
_IDS = tf.TensorSpec([None, None], tf.int32, name="source_ids")
_OUT_IDS = tf.TensorSpec([None, None], tf.int32, name="ids")
_ALPHA = tf.TensorSpec([], tf.float32, name="alpha")
_EXTRA = tf.TensorSpec([], tf.int32, name="extra_length")


def decode_config(base: DecodeConfig, overrides: dict) -> DecodeConfig:
    """The model dir's decoding settings with the user's overrides.

    As in the translate binary; in addition nbest defaults to beam_size, so
    the translate_nbest signature returns every beam (serving_default and
    translate use the single best, whatever nbest is).
    """
    changes = dict(overrides)
    changes.setdefault("nbest", changes.get("beam_size", base.beam_size))
    return dataclasses.replace(base, **changes)


def load_translator(model_dir: str, decode: DecodeConfig, checkpoint: str | None = None,
                    average_last: int = 0) -> tuple[Translator, list[str]]:
    """The Translator of `model_dir` and the checkpoint paths its weights come from.

    `checkpoint` (a path or a directory) picks one; `average_last=N` averages the
    last N checkpoints of model_dir in memory (checkpoints.average_into); by
    default the latest checkpoint.
    """
    if checkpoint and average_last:
        raise ValueError("give either a checkpoint or average_last, not both")
    if not average_last:
        path = checkpoint or model_dir
        if tf.io.gfile.isdir(path):
            path = tf.train.latest_checkpoint(path)
        if not path:
            raise FileNotFoundError(f"no checkpoint in {checkpoint or model_dir}")
        return Translator.from_model_dir(model_dir, path, decode), [path]
    paths = checkpoints.checkpoint_paths(model_dir)[-average_last:]
    if len(paths) < average_last:
        raise ValueError(f"{model_dir} keeps {len(paths)} checkpoints, fewer than "
                         f"average_last={average_last}")
    config = Config.load(model_dir)
    model = build_model(config.model)
    checkpoints.average_into(model, paths)
    tokenizer = Tokenizer(os.path.join(model_dir, checkpoints.VOCAB_FILE))
    return Translator(model, tokenizer, decode, config.data.max_length), paths


class _Untracked:
    """Holds an object without making it part of the SavedModel's object graph."""

    def __init__(self, value):
        self.value = value


class ServingModule(tf.Module):
    """The exported object: a Translator, its vocabulary and metadata as assets.

    Loaded in Python, `translate(text, alpha=-1., extra_length=-1)`,
    `translate_nbest(...)` and `translate_ids(...)` keep their optional
    arguments; the signatures (SIGNATURES) are for TF Serving, which needs
    every input of a signature in each request.

    Variables: the Keras model is not tracked; its weights' underlying
    tf.Variables are (`model_variables`), as keras.export.ExportArchive does.
    Saving a Keras 3 model object directly writes each weight twice in the
    graph-mode view: the functions read graph copies of the inner tf.Variables
    that the SavedModel's restore op never fills (only fresh copies made for
    the Keras wrappers are restored), so a session-based loader (TF Serving,
    `saved_model_cli run`) failed with "Could not find variable ...qkv_bias".
    """

    def __init__(self, translator: Translator, vocab_path: str, metadata_path: str):
        super().__init__(name="serving")
        self._translator = _Untracked(translator)
        self.model_variables = [w.value for w in translator.model.weights]
        self.tokenizer = translator.tokenizer  # its SentencepieceOp resource
        self.vocab = tf.saved_model.Asset(vocab_path)
        self.metadata = tf.saved_model.Asset(metadata_path)
        self.beam_size = tf.constant(translator.beam_size, name="beam_size")
        self.nbest = tf.constant(translator.nbest, name="nbest")
        self.alpha = tf.constant(translator.alpha, name="alpha")
        self.extra_length = tf.constant(translator.extra_length, name="extra_length")
        self.max_source_length = tf.constant(translator.max_source_length)

    @property
    def translator(self) -> Translator:
        return self._translator.value

    @tf.function(input_signature=[_TEXT])
    def serve(self, text):
        out = self.translator.translate(text)
        return {"translation": out["translation"], "score": out["score"]}

    @tf.function(input_signature=[_TEXT, _ALPHA, _EXTRA])
    def translate(self, text, alpha=-1.0, extra_length=-1):
        return self.translator.translate(text, alpha, extra_length)

    @tf.function(input_signature=[_TEXT, _ALPHA, _EXTRA])
    def translate_nbest(self, text, alpha=-1.0, extra_length=-1):
        return self.translator.translate_nbest(text, alpha, extra_length)

    @tf.function(input_signature=[_IDS, _ALPHA, _EXTRA])
    def translate_ids(self, source_ids, alpha=-1.0, extra_length=-1):
        return self.translator.translate_ids(source_ids, alpha, extra_length)

    @tf.function(input_signature=[_TEXT])
    def tokenize(self, text):
        return {"source_ids": self.translator.source_ids(text)}

    @tf.function(input_signature=[_OUT_IDS])
    def detokenize(self, ids):
        return {"text": self.translator.tokenizer.detokenize(ids)}

    def signatures(self) -> dict:
        return {
            "serving_default": self.serve.get_concrete_function(),
            "translate": self.translate.get_concrete_function(),
            "translate_nbest": tf.function(
                lambda text: self.translate_nbest(text),
                input_signature=[_TEXT]).get_concrete_function(),
            "translate_ids": tf.function(
                lambda source_ids: self.translate_ids(source_ids),
                input_signature=[_IDS]).get_concrete_function(),
            "tokenize": self.tokenize.get_concrete_function(),
            "detokenize": self.detokenize.get_concrete_function(),
        }


SIGNATURES = ("serving_default", "translate", "translate_nbest", "translate_ids", "tokenize",
              "detokenize")


# -- versions ----------------------------------------------------------------
def _versions(export_dir: str) -> list[int]:
    return [int(n) for n in os.listdir(export_dir) if n.isdigit()]


def _last_issued(export_dir: str) -> int:
    try:
        with open(os.path.join(export_dir, LAST_VERSION_FILE)) as f:
            return int(f.read().strip() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def claim_version(export_dir: str) -> tuple[int, str]:
    """Reserves the next version number: (version, its temporary directory).

    The temporary directory is created with os.mkdir, which fails if another
    exporter claimed the same number first; then the next number is tried.
    The claim is recorded in .last_version before anything is written, so a
    failed or deleted export never has its number reused.
    """
    os.makedirs(export_dir, exist_ok=True)
    version = max(_versions(export_dir) + [_last_issued(export_dir), 0]) + 1
    while True:
        tmp = os.path.join(export_dir, f"{TMP_PREFIX}{version}")
        if not os.path.exists(os.path.join(export_dir, str(version))):
            try:
                os.mkdir(tmp)
                break
            except FileExistsError:
                pass
        version += 1
    marker = os.path.join(export_dir, LAST_VERSION_FILE)
    fd, marker_tmp = tempfile.mkstemp(dir=export_dir, prefix=".last_version.")
    with os.fdopen(fd, "w") as f:
        f.write(f"{max(version, _last_issued(export_dir))}\n")
    os.chmod(marker_tmp, 0o644)
    os.replace(marker_tmp, marker)
    return version, tmp


# -- warmup --------------------------------------------------------------------
def warmup_batches(sentences: Sequence[str]) -> list[list[str]]:
    """Batches of 1 (each sentence, shortest first) and one batch of all of them."""
    ordered = sorted(sentences, key=len)
    return [[s] for s in ordered] + ([list(ordered)] if len(ordered) > 1 else [])


def write_warmup_requests(path: str, sentences: Sequence[str], model_name: str) -> int:
    """Writes TF Serving's warmup file: a TFRecord of PredictionLog protos.

    One PredictRequest per batch of `warmup_batches`, for serving_default and,
    for the largest batch, translate_nbest. Returns the number of records.
    """
    from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

    requests = [("serving_default", batch) for batch in warmup_batches(sentences)]
    if sentences:
        requests.append(("translate_nbest", list(sentences)))
    tf.io.gfile.makedirs(os.path.dirname(path))
    with tf.io.TFRecordWriter(path) as writer:
        for signature, batch in requests:
            request = predict_pb2.PredictRequest()
            request.model_spec.name = model_name
            request.model_spec.signature_name = signature
            request.inputs["text"].CopyFrom(tf.make_tensor_proto(batch, dtype=tf.string))
            log = prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())
    return len(requests)


def read_warmup_requests(path: str) -> list:
    """The PredictRequests of a warmup file, in order."""
    from tensorflow_serving.apis import prediction_log_pb2

    logs = []
    for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
        logs.append(prediction_log_pb2.PredictionLog.FromString(record).predict_log.request)
    return logs


# -- export ----------------------------------------------------------------------
def export(translator: Translator, export_dir: str, vocab_path: str, metadata: dict,
           warmup_sentences: Sequence[str] = (), model_name: str = "transformer") -> str:
    """Writes the next version of `export_dir` and returns its path.

    `metadata` (config, checkpoints, ...) is completed with the decode
    settings, signatures and versions and stored as assets/export_metadata.json.
    """
    version, tmp = claim_version(export_dir)
    final = os.path.join(export_dir, str(version))
    staging = tempfile.mkdtemp(prefix="export-staging-")
    try:
        with open(vocab_path, "rb") as f:
            vocab = f.read()
        staged_vocab = os.path.join(staging, checkpoints.VOCAB_FILE)
        with open(staged_vocab, "wb") as f:
            f.write(vocab)
        metadata = {
            **metadata,
            "version": version,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "decode": {"beam_size": translator.beam_size, "nbest": translator.nbest,
                       "alpha": translator.alpha, "extra_length": translator.extra_length,
                       "jit_compile": translator.jit_compile,
                       "length_bucket": LENGTH_BUCKET if translator.jit_compile else None},
            "max_source_length": translator.max_source_length,
            "max_target_length": translator.max_target_length,
            "vocab_sha256": hashlib.sha256(vocab).hexdigest(),
            "signatures": list(SIGNATURES),
            "tensorflow": tf.__version__,
            "tensorflow_text": _tensorflow_text_version(),
        }
        staged_metadata = os.path.join(staging, METADATA_FILE)
        with open(staged_metadata, "w") as f:
            json.dump(metadata, f, indent=2, sort_keys=True)
        module = ServingModule(translator, staged_vocab, staged_metadata)
        tf.saved_model.save(module, tmp, signatures=module.signatures())
        if warmup_sentences:
            write_warmup_requests(os.path.join(tmp, WARMUP_FILE), warmup_sentences, model_name)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logging.info("exported version %d to %s", version, final)
    return final


def _tensorflow_text_version() -> str:
    import tensorflow_text
    return getattr(tensorflow_text, "__version__", "unknown")


def embedded_sentencepiece_models(saved_model_dir: str) -> list[bytes]:
    """The `model` attributes of every SentencepieceOp in the SavedModel's graph."""
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(saved_model_dir, "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    found = []
    for meta_graph in proto.meta_graphs:
        nodes = list(meta_graph.graph_def.node)
        for function in meta_graph.graph_def.library.function:
            nodes.extend(function.node_def)
        found.extend(n.attr["model"].s for n in nodes if n.op == "SentencepieceOp")
    return found


def read_sentences(path: str, limit: int | None = None) -> list[str]:
    """Non-empty lines of a text file (the source column of a TSV)."""
    with open(path, encoding="utf-8") as f:
        lines = [line.rstrip("\n").split("\t")[0] for line in f]
    lines = [line for line in lines if line.strip()]
    return lines[:limit] if limit else lines
