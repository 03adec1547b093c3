"""Export of the Translator as a TF Serving SavedModel (`python -m export`).

Layout: EXPORT_DIR/<version>/ with saved_model.pb, variables/, assets/
(vocab.model, export_metadata.json) and assets.extra/tf_serving_warmup_requests
(warmup.py). Versions (versions.py) are integers, never reused, renamed into
place when complete, so a server never sees half an export.

The graph is the Translator's (the same tf.functions the translate binary
runs), wrapped by `ServingModule` into signatures (all of them, or those chosen:
`export --signatures`, serving_default always among them; each search a signature
does not need is then neither traced, saved nor loaded):

  serving_default  text string [B] -> translation string [B], score float32 [B]
  translate        text [B], alpha float32 [], extra_length int32 [] (negative:
                   the baked-in value) -> translation [B], score [B], length int32 [B]
  translate_nbest  text [B] -> translations string [B, nbest], scores float32
                   [B, nbest], lengths int32 [B, nbest], best first
  translate_ids    source_ids int32 [B, S] (tokens, EOS, PAD=0 after) ->
                   ids int32 [B, nbest, T], scores float32 [B, nbest], lengths int32 [B, nbest]
  tokenize         text [B] -> source_ids int32 [B, S] (as translate prepares them)
  detokenize       ids int32 [B, T] -> text string [B] (stops at EOS, drops PAD/BOS)
  score            source, target string [B] -> log_prob float32 [B], tokens int32 [B],
                   log_prob_per_token float32 [B], score float32 [B] (teacher-forced)
  sample           text [B], sampling_topk int32 [], sampling_topp float32 [],
                   sampling_temperature float32 [], seed int64 [] -> translation [B],
                   score [B], length [B]: one output drawn per input
  translate_with_prefix  text [B], prefix string [B] ("" for none) -> translate's
                   outputs, each translation starting with its prefix (search/prefix.py)
  translate_with_alignments  text [B] -> translate's outputs, translation_unk_replaced
                   string [B], alignment float32 [B, T, S], target_tokens int32 [B],
                   source_length int32 [B]

SentencePiece: tensorflow-text's SentencepieceOp takes the serialized model as
an op *attribute*, so the graph carries its own copy of the vocabulary; the
same file is also shipped as the asset assets/vocab.model (for clients that
tokenize themselves, and for operators) and `export_metadata.json` records its
SHA-256 (with separate vocabularies, assets/source_vocab.model for tokenize and
the translate signatures' input, assets/target_vocab.model for detokenize and
their output, each with its SHA-256). `embedded_sentencepiece_models` reads
the copies out of the graph, so a test can check both are the same bytes.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import shutil
import tempfile
from typing import Sequence

import tensorflow as tf
from absl import logging

from tf_transformer.decoding import signatures
from tf_transformer.decoding.compiled_search import LENGTH_BUCKET
from tf_transformer.decoding.translator import Translator
from tf_transformer.exporters import versions, warmup

METADATA_FILE = "export_metadata.json"

# Signature -> (the ServingModule function it calls, that function's inputs).
_FUNCTIONS = {
    "serving_default": ("serve", [signatures.TEXT]),
    "translate": ("translate", [signatures.TEXT, signatures.ALPHA, signatures.EXTRA]),
    "translate_nbest": ("translate_nbest", [signatures.TEXT, signatures.ALPHA, signatures.EXTRA]),
    "translate_ids": ("translate_ids", [signatures.IDS, signatures.ALPHA, signatures.EXTRA]),
    "tokenize": ("tokenize", [signatures.TEXT]),
    "detokenize": ("detokenize", [signatures.OUT_IDS]),
    "score": ("score", [signatures.SOURCE, signatures.TARGET]),
    "sample": ("sample", [signatures.TEXT, signatures.TOPK, signatures.TOPP,
                          signatures.TEMPERATURE, signatures.SEED]),
    "translate_with_prefix": ("translate_with_prefix", [signatures.TEXT, signatures.PREFIX]),
    "translate_with_alignments": ("translate_with_alignments",
                                  [signatures.TEXT, signatures.ALPHA, signatures.EXTRA]),
}
SIGNATURES = tuple(_FUNCTIONS)
# Their signatures take the first input alone (TF Serving needs every input of a signature;
# the options have the `translate` signature).
_FIRST_INPUT_ONLY = ("translate_nbest", "translate_ids", "translate_with_alignments")


def chosen_signatures(names: Sequence[str] | None) -> tuple[str, ...]:
    """`names` checked and in SIGNATURES' order, serving_default always among them (TF
    Serving's default and the warmup requests' signature); None: every signature."""
    if names is None:
        return SIGNATURES
    unknown = sorted(set(names) - set(SIGNATURES))
    if unknown:
        raise ValueError(f"unknown signatures {unknown}: choose from {', '.join(SIGNATURES)}")
    return tuple(n for n in SIGNATURES if n == "serving_default" or n in names)


class _Untracked:
    """Holds an object without making it part of the SavedModel's object graph."""

    def __init__(self, value):
        self.value = value


class ServingModule(tf.Module):
    """The exported object: a Translator, its vocabulary and metadata as assets, and the
    functions of the chosen signatures (`chosen_signatures`).

    Only the chosen signatures' functions are attributes of the module, so only their
    searches are traced, saved and loaded: `tf.saved_model.save` saves every tf.function
    it finds on the object, signature or not. Loaded in Python, `translate(text,
    alpha=-1., extra_length=-1)`, `translate_nbest(...)` and `translate_ids(...)` keep
    their optional arguments; the signatures are for TF Serving, which needs every input
    of a signature in each request.

    Variables: the Keras model is not tracked; its weights' underlying
    tf.Variables are (`model_variables`), as keras.export.ExportArchive does.
    Saving a Keras 3 model object directly writes each weight twice in the
    graph-mode view: the functions read graph copies of the inner tf.Variables
    that the SavedModel's restore op never fills (only fresh copies made for
    the Keras wrappers are restored), so a session-based loader (TF Serving,
    `saved_model_cli run`) failed with "Could not find variable ...qkv_bias".
    """

    def __init__(self, translator: Translator, vocab_path: str | Sequence[str],
                 metadata_path: str, signature_names: Sequence[str] = SIGNATURES):
        super().__init__(name="serving")
        self._translator = _Untracked(translator)
        self._signature_names = chosen_signatures(signature_names)
        self.model_variables = [w.value for w in translator.model.weights]
        self.tokenizer = translator.tokenizer  # its SentencepieceOp resource
        if isinstance(vocab_path, str):
            self.vocab = tf.saved_model.Asset(vocab_path)
        else:  # separate vocabularies: (source, target)
            self.target_tokenizer = translator.target_tokenizer
            self.source_vocab, self.target_vocab = map(tf.saved_model.Asset, vocab_path)
        self.metadata = tf.saved_model.Asset(metadata_path)
        self.beam_size = tf.constant(translator.beam_size, name="beam_size")
        self.nbest = tf.constant(translator.nbest, name="nbest")
        self.alpha = tf.constant(translator.alpha, name="alpha")
        self.extra_length = tf.constant(translator.extra_length, name="extra_length")
        self.max_source_length = tf.constant(translator.max_source_length)
        for name in self._signature_names:
            function, inputs = _FUNCTIONS[name]
            setattr(self, function, tf.function(getattr(self, "_" + function), autograph=False,
                                                input_signature=inputs))

    @property
    def translator(self) -> Translator:
        return self._translator.value

    def _serve(self, text):
        out = self.translator.translate(text)
        return {"translation": out["translation"], "score": out["score"]}

    def _translate(self, text, alpha=-1.0, extra_length=-1):
        return self.translator.translate(text, alpha, extra_length)

    def _translate_nbest(self, text, alpha=-1.0, extra_length=-1):
        return self.translator.translate_nbest(text, alpha, extra_length)

    def _translate_ids(self, source_ids, alpha=-1.0, extra_length=-1):
        return self.translator.translate_ids(source_ids, alpha, extra_length)

    def _tokenize(self, text):
        return {"source_ids": self.translator.source_ids(text)}

    def _detokenize(self, ids):
        return {"text": self.translator.target_tokenizer.detokenize(ids)}

    def _score(self, source, target):
        return self.translator.score(source, target)

    def _sample(self, text, sampling_topk, sampling_topp, sampling_temperature, seed):
        return self.translator.sample(text, sampling_topk, sampling_topp, sampling_temperature,
                                      seed)

    def _translate_with_prefix(self, text, prefix):
        return self.translator.translate_with_prefix(text, prefix)

    def _translate_with_alignments(self, text, alpha=-1.0, extra_length=-1):
        return self.translator.translate_with_alignments(text, alpha, extra_length)

    def signatures(self) -> dict:
        """The chosen signatures as tf.functions, not concrete functions:
        `tf.saved_model.save` traces them inside its save context, where the module's own
        functions are retraced too, so both share one trace of each search (concrete
        functions traced before the save were a second copy of every search in the graph)."""
        chosen = {}
        for name in self._signature_names:
            function = getattr(self, _FUNCTIONS[name][0])
            chosen[name] = _first_input_only(function) if name in _FIRST_INPUT_ONLY else function
        return chosen


def _first_input_only(function):
    """A signature of `function` that takes its first input alone, the optional ones left
    at their defaults."""
    return tf.function(lambda first: function(first), autograph=False,
                       input_signature=function.input_signature[:1])


def export(translator: Translator, export_dir: str, vocab_path: str | Sequence[str],
           metadata: dict, warmup_sentences: Sequence[str] = (),
           model_name: str = "transformer",
           signature_names: Sequence[str] | None = None) -> str:
    """Writes the next version of `export_dir` and returns its path.

    `vocab_path`: the shared vocabulary's file, or (source, target) files
    (model_dir.vocab_paths; one path twice is the shared one). `metadata`
    (config, checkpoints, ...) is completed with the decode
    settings, signatures and versions and stored as assets/export_metadata.json.
    `signature_names`: the signatures to export (`chosen_signatures`; None: all).
    """
    chosen = chosen_signatures(signature_names)
    paths = [vocab_path] if isinstance(vocab_path, str) else list(dict.fromkeys(vocab_path))
    version, tmp = versions.claim_version(export_dir)
    final = os.path.join(export_dir, str(version))
    staging = tempfile.mkdtemp(prefix="export-staging-")
    try:
        hashes, staged_vocabs = {}, []
        for path in paths:
            with open(path, "rb") as f:
                vocab = f.read()
            staged_vocabs.append(os.path.join(staging, os.path.basename(path)))
            with open(staged_vocabs[-1], "wb") as f:
                f.write(vocab)
            hashes[os.path.basename(path).replace(".model", "_sha256")] = \
                hashlib.sha256(vocab).hexdigest()
        metadata = {
            **metadata,
            "version": version,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "decode": {"beam_size": translator.beam_size, "nbest": translator.nbest,
                       "alpha": translator.alpha, "extra_length": translator.extra_length,
                       "jit_compile": translator.jit_compile,
                       "length_bucket": LENGTH_BUCKET if translator.jit_compile else None,
                       "dtype": translator.dtype,
                       "bounded_shapes": translator.model_search.bounded_shapes},
            "max_source_length": translator.max_source_length,
            "max_target_length": translator.max_target_length,
            **hashes,  # vocab_sha256, or source_vocab_sha256 and target_vocab_sha256
            "signatures": list(chosen),
            "tensorflow": tf.__version__,
            "tensorflow_text": _tensorflow_text_version(),
        }
        staged_metadata = os.path.join(staging, METADATA_FILE)
        with open(staged_metadata, "w") as f:
            json.dump(metadata, f, indent=2, sort_keys=True)
        module = ServingModule(translator, staged_vocabs[0] if len(staged_vocabs) == 1
                               else staged_vocabs, staged_metadata, chosen)
        tf.saved_model.save(module, tmp, signatures=module.signatures())
        if warmup_sentences:
            wide = warmup.sentences_per_width(
                warmup_sentences, lambda text: int(tf.shape(translator.source_ids([text]))[1]),
                translator.max_source_length)
            warmup.write_warmup_requests(os.path.join(tmp, warmup.WARMUP_FILE), warmup_sentences,
                                         model_name, wide,
                                         nbest_request="translate_nbest" in chosen)
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


