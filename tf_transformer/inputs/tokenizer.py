"""SentencePiece vocabularies, applied inside the TensorFlow graph.

Training uses the `sentencepiece` package (BPE by default, as in section 5.1:
37000 tokens for WMT EN-DE, 32000 for EN-FR; 8000 suits the small embedded
corpus). The ids of the special pieces are fixed for every model this project
trains: <pad>=0 (`config.PAD_ID`), <unk>=1, <s>=2 (BOS), </s>=3 (EOS).

Byte fallback (on by default): the vocabulary also holds the 256 UTF-8 byte
pieces <0x00>..<0xFF> (ids 4-259), and a character without a piece of its own
(rare ones fall outside `character_coverage`, or never occur in training)
becomes its bytes instead of <unk>, so every character survives the round trip
and a model never needs to emit <unk> (the Translator forbids it:
`Tokenizer.byte_fallback`). Without it, such characters become <unk>, which
detokenizes to " ⁇ ".

`Tokenizer` wraps `tensorflow_text.SentencepieceTokenizer`, so the same op
tokenises for training, evaluation and the exported SavedModel (which needs only
`tensorflow` and `tensorflow_text` to load). Invalid UTF-8 does not break the op:
each invalid byte becomes <unk> (with byte fallback: U+FFFD's bytes), so no
in-graph sanitising is done.

One vocabulary serves both sides by default; language pairs in different
scripts may use one per side, a `TokenizerPair` (source, target). Code that
takes either calls `sides(tokenizer)`.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import os
from typing import Iterable, Iterator, NamedTuple

import tensorflow as tf
import tensorflow_text as tf_text

from tf_transformer.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID, VOCAB_MODEL_TYPES, VOCAB_SIDES
from tf_transformer.inputs import corpus as corpus_lib
from tf_transformer.inputs.streamed import StreamedCorpus

BYTE_PIECES = 256  # <0x00>..<0xFF>, in a vocabulary with byte fallback
MAX_TRAINING_SENTENCES = 4_000_000  # beyond this, an evenly spaced subset is used


def train_sentencepiece(texts_or_corpus: Iterable[str] | corpus_lib.Corpus | StreamedCorpus,
                        vocab_size: int, output_path: str | None = None,
                        model_type: str = "bpe", character_coverage: float = 0.9995,
                        seed: int = 1, max_sentences: int = MAX_TRAINING_SENTENCES,
                        byte_fallback: bool = True, side: str | None = None) -> bytes:
    """Trains one vocabulary on `texts` (both sides of a `Corpus` or `StreamedCorpus`,
    or only `side`, "source" or "target", for separate vocabularies).

    `byte_fallback` adds the 256 byte pieces (module docstring), so `vocab_size`
    must exceed 260 plus the characters kept. Deterministic: one training thread
    and a fixed generator seed. Texts in
    memory beyond `max_sentences` are cut to an evenly spaced (not random)
    subset; a `StreamedCorpus` is streamed to SentencePiece, which keeps a
    seeded reservoir sample of `max_sentences`, so the corpus is never held.
    Returns the serialized model and writes it to `output_path` if given.
    """
    import sentencepiece as spm  # training only; serving needs tensorflow_text

    if model_type not in VOCAB_MODEL_TYPES:
        raise ValueError(f"model_type must be one of {VOCAB_MODEL_TYPES}, got {model_type!r}")
    if side not in (None, *VOCAB_SIDES):
        raise ValueError(f"side must be one of {VOCAB_SIDES} or None (both), got {side!r}")
    sample = {"input_sentence_size": 0, "shuffle_input_sentence": False}
    if isinstance(texts_or_corpus, StreamedCorpus):
        texts = _non_empty(texts_or_corpus.texts(side))
        sample = {"input_sentence_size": max_sentences, "shuffle_input_sentence": True}
    else:
        if isinstance(texts_or_corpus, corpus_lib.Corpus):
            texts = list({None: texts_or_corpus.texts(), "source": texts_or_corpus.sources,
                          "target": texts_or_corpus.targets}[side])
        elif side is not None:
            raise ValueError("side needs a Corpus or a StreamedCorpus")
        else:
            texts = list(texts_or_corpus)
        if len(texts) > max_sentences:
            stride = len(texts) / max_sentences
            texts = [texts[int(i * stride)] for i in range(max_sentences)]
        if not texts:
            raise ValueError("no text to train a vocabulary on")
        texts = iter(texts)
    spm.set_random_generator_seed(seed)
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=texts, model_writer=model, vocab_size=vocab_size,
            model_type=model_type, character_coverage=character_coverage,
            byte_fallback=byte_fallback,
            pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
            num_threads=1, minloglevel=2, **sample)
    except RuntimeError as error:
        if byte_fallback and "smaller than required_chars" in str(error):
            raise ValueError(f"vocab_size={vocab_size} is too small: byte fallback takes "
                             f"{BYTE_PIECES} pieces besides the characters ({error}); choose a "
                             "larger vocabulary or turn byte fallback off") from error
        raise
    proto = model.getvalue()
    if output_path:
        directory = os.path.dirname(output_path)
        if directory:
            tf.io.gfile.makedirs(directory)
        with tf.io.gfile.GFile(output_path, "wb") as f:
            f.write(proto)
    return proto


def _non_empty(texts: Iterator[str]) -> Iterator[str]:
    """`texts`, or ValueError before SentencePiece sees an empty stream."""
    first = next(texts, None)
    if first is None:
        raise ValueError("no text to train a vocabulary on")
    return itertools.chain([first], texts)


class Tokenizer(tf.Module):
    """Strings to ids and back, in the graph; no BOS/EOS are added.

    Args:
      model: a SentencePiece `.model` path, or the serialized model bytes.
    """

    def __init__(self, model: str | os.PathLike | bytes, name: str | None = None):
        super().__init__(name=name)
        if isinstance(model, (str, os.PathLike)):
            with tf.io.gfile.GFile(os.fspath(model), "rb") as f:
                model = f.read()
        self.model_proto: bytes = model
        # The op's resource is owned by its kernel and named after its node: a SavedModel
        # whose two vocabularies' nodes had one name (tensorflow-text's default scope)
        # loaded both as the first. A scope named after the model keeps them apart.
        scope = "sentencepiece_" + hashlib.sha256(model).hexdigest()[:16]
        self._sp = tf_text.SentencepieceTokenizer(model=model, out_type=tf.int32, name=scope)
        self.vocab_size: int = int(self._sp.vocab_size())
        pieces = [p.decode() for p in self._sp.id_to_string(tf.range(4)).numpy()]
        if pieces != ["<pad>", "<unk>", "<s>", "</s>"]:
            raise ValueError(f"SentencePiece model has special pieces {pieces} at ids 0-3; "
                             "expected <pad> <unk> <s> </s> (train it with train_sentencepiece)")
        self.byte_fallback: bool = has_byte_fallback(model)

    def tokenize(self, strings: tf.Tensor) -> tf.RaggedTensor:
        """[N] strings -> int32 ragged [N, (tokens)]."""
        return self._sp.tokenize(strings)

    def detokenize(self, ids: tf.Tensor | tf.RaggedTensor) -> tf.Tensor:
        """int32 [N, T] (dense or ragged) -> [N] strings.

        Stops at the first EOS and ignores PAD and BOS, so decoder output can be
        passed as it is.
        """
        if isinstance(ids, tf.RaggedTensor):
            ids = ids.to_tensor(default_value=PAD_ID)
        ids = tf.cast(ids, tf.int32)
        before_eos = tf.math.cumsum(tf.cast(ids == EOS_ID, tf.int32), axis=-1) == 0
        keep = before_eos & (ids != PAD_ID) & (ids != BOS_ID)
        return self._sp.detokenize(tf.ragged.boolean_mask(ids, keep))

    def id_to_piece(self, ids: tf.Tensor) -> tf.Tensor:
        return self._sp.id_to_string(ids)

    def tokenize_with_offsets(self, strings: tf.Tensor):
        """`tokenize` and each token's byte span of its string: (int32 ragged ids,
        int64 ragged starts, int64 ragged ends), each [N, (tokens)]."""
        return self._sp.tokenize_with_offsets(strings)

def has_byte_fallback(model_proto: bytes) -> bool:
    """Whether the serialized SentencePiece model has byte fallback and its 256 byte
    pieces: then no character needs <unk>."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto.FromString(model_proto)
    byte = sentencepiece_model_pb2.ModelProto.SentencePiece.BYTE
    return bool(proto.trainer_spec.byte_fallback) and sum(
        piece.type == byte for piece in proto.pieces) == BYTE_PIECES


class TokenizerPair(NamedTuple):
    """Separate vocabularies: `source` tokenizes the input, `target` the output."""

    source: Tokenizer
    target: Tokenizer


def sides(tokenizer: Tokenizer | TokenizerPair) -> TokenizerPair:
    """The (source, target) tokenizers: a shared Tokenizer serves both sides."""
    if isinstance(tokenizer, TokenizerPair):
        return tokenizer
    return TokenizerPair(tokenizer, tokenizer)


def load(source_path: str, target_path: str) -> Tokenizer | TokenizerPair:
    """The Tokenizer of one shared model file, or a TokenizerPair of two."""
    if os.path.abspath(source_path) == os.path.abspath(target_path):
        return Tokenizer(source_path)
    return TokenizerPair(Tokenizer(source_path), Tokenizer(target_path))
