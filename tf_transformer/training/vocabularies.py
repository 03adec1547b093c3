"""The vocabularies a training run tokenizes with, made on the spot when missing.

One shared SentencePiece model (MODEL_DIR/vocab.model, or --vocab), or one per
side (source_vocab.model and target_vocab.model: embeddings not shared), each
trained from the training corpus by the chief worker while the others wait for
the file. A fine-tuned run (--init_from) takes its source model's
vocabularies unless it names a new shared one (fine_tuning.py remaps it).
"""

from __future__ import annotations

import dataclasses
import os

from absl import logging

from tf_transformer.inputs import tokenizer
from tf_transformer.model_dir import ModelDir
from tf_transformer.training import distribution


@dataclasses.dataclass(frozen=True)
class VocabularyRequest:
    """What the user asked for (the training binary's vocabulary flags).

    shared: a shared model's path (--vocab); size: pieces of one trained on the
    spot (--vocab_size); source/target and their sizes: separate vocabularies.
    """

    shared: str | None = None
    size: int = 8000
    byte_fallback: bool = True
    source: str | None = None
    target: str | None = None
    source_size: int | None = None
    target_size: int | None = None

    @property
    def separate(self) -> bool:
        return any(v is not None for v in (self.source, self.target, self.source_size,
                                           self.target_size))


def vocabularies(request: VocabularyRequest, model_dir: ModelDir, train_corpus, chief: bool,
                 init_from_dir: ModelDir | None = None):
    """The shared Tokenizer, or a TokenizerPair for separate vocabularies.

    With `init_from_dir` (fine-tuning) and nothing asked beyond a shared --vocab,
    the source model directory's own vocabularies (as long as model_dir has none)."""
    if init_from_dir and not request.separate and not request.shared:
        source, target = init_from_dir.vocab_paths()
        if model_dir.has_vocabularies():
            source, target = model_dir.vocab_paths()
        if source == target:
            return tokenizer.Tokenizer(source)
        return tokenizer.TokenizerPair(tokenizer.Tokenizer(source), tokenizer.Tokenizer(target))
    if not request.separate:
        return tokenizer.Tokenizer(_vocabulary(
            request.shared, model_dir.shared_vocab_path, request.size,
            None, request.byte_fallback, train_corpus, chief))
    pair = []
    for side, path, size, default_path in zip(
            ("source", "target"), (request.source, request.target),
            (request.source_size, request.target_size), model_dir.separate_vocab_paths):
        pair.append(tokenizer.Tokenizer(_vocabulary(
            path, default_path, size or request.size, side,
            request.byte_fallback, train_corpus, chief)))
    return tokenizer.TokenizerPair(*pair)


def _vocabulary(path: str | None, default_path: str, size: int, side: str | None,
                byte_fallback: bool, train_corpus, chief: bool) -> str:
    """`path`, or `default_path` trained on `side` ("source", "target"; None: both) by the
    chief if missing, while the other workers wait for it."""
    vocab_path = path or default_path
    if not os.path.exists(vocab_path):
        if chief:
            logging.info("training a %d-piece %svocabulary into %s", size,
                         f"{side} " if side else "", vocab_path)
            os.makedirs(os.path.dirname(vocab_path) or ".", exist_ok=True)
            tokenizer.train_sentencepiece(train_corpus, size, vocab_path + ".tmp",
                                          byte_fallback=byte_fallback, side=side)
            os.replace(vocab_path + ".tmp", vocab_path)
        else:
            distribution.wait_for_file(vocab_path)
    return vocab_path
