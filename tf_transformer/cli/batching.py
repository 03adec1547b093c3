"""Sentences to translations on the host: batches sorted by length, results in input order.

`translate_sentences` is what the translate, evaluate and train (dev BLEU) binaries
run over a list of sentences: it tokenizes them once to sort them by token count,
hands each batch to a `DecodeBatch` (by default the Translator's beam search,
`beam_batches`; cli/decoders.py has sampling and alignments), and turns the batch's
arrays into one `Translation` per sentence.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np
import tensorflow as tf

from tf_transformer.decoding.translator import Translator

_TOKENIZE_CHUNK = 1024  # sentences tokenized at once: bounded memory for big inputs


@dataclasses.dataclass
class Translation:
    """One input sentence's hypotheses, best first."""

    texts: list[str]
    scores: list[float]
    lengths: list[int]  # target tokens, EOS included
    source_tokens: int  # before truncation, EOS not included
    # With alignments (translate_with_alignments): per hypothesis float32 [length,
    # source tokens + EOS], and its target tokens before EOS.
    alignments: list[np.ndarray] | None = None
    target_tokens: list[int] | None = None


# (text [B], and with target prefixes prefix [B]) -> {"translations" [B, n] strings,
# "scores", "lengths" [B, n], and optionally "alignments" [B, n, T, S], "target_tokens"
# [B, n], "source_lengths" [B]}: what translate_sentences runs per batch.
DecodeBatch = Callable[..., dict]


def beam_batches(translator: Translator, nbest: bool = False) -> DecodeBatch:
    """The beam search's best (translate) or n-best (translate_nbest) per batch; given
    target prefixes, the best continuing each (translate_with_prefix)."""
    def decode(text: tf.Tensor, prefix: tf.Tensor | None = None) -> dict:
        if nbest:
            return translator.translate_nbest(text)
        if prefix is not None:
            out = translator.translate_with_prefix(text, prefix)
        else:
            out = translator.translate(text)
        return {"translations": out["translation"][:, None], "scores": out["score"][:, None],
                "lengths": out["length"][:, None]}
    return decode


def _source_token_counts(translator: Translator, sentences: Sequence[str]) -> np.ndarray:
    """int64 [len(sentences)]: each sentence's tokens under the translator's source
    vocabulary, before truncation, EOS not included."""
    counts = np.zeros([len(sentences)], np.int64)
    for start in range(0, len(sentences), _TOKENIZE_CHUNK):
        chunk = tf.constant(list(sentences[start:start + _TOKENIZE_CHUNK]), tf.string)
        counts[start:start + len(chunk)] = translator.tokenizer.tokenize(chunk).row_lengths()
    return counts


def translate_sentences(translator: Translator, sentences: Sequence[str],
                        batch_size: int = 32, nbest: bool = False,
                        decode_batch: DecodeBatch | None = None,
                        on_batch: Callable[[int], None] | None = None,
                        prefixes: Sequence[str] | None = None) -> list[Translation]:
    """Translates a list of sentences in batches sorted by length; results in input order.

    Sorting by token count keeps each batch's padding and its slowest
    sentence close to the rest (beam search runs until its batch's last
    sentence is done). With `nbest`, each result holds translator.nbest hypotheses.
    `decode_batch` replaces the beam search's batches (default: beam_batches).
    `on_batch(sentences)` is called after each batch (progress lines), shortest first.
    `prefixes` (one per sentence, "" for none): each output continues its target prefix.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    decode_batch = decode_batch or beam_batches(translator, nbest)
    source_tokens = _source_token_counts(translator, sentences)
    order = np.argsort(source_tokens, kind="stable")
    results: list[Translation | None] = [None] * len(sentences)
    for start in range(0, len(order), batch_size):
        index = order[start:start + batch_size]
        batch = [tf.constant([sentences[i] for i in index], tf.string)]
        if prefixes is not None:
            batch.append(tf.constant([prefixes[i] for i in index], tf.string))
        out = {k: v.numpy() for k, v in decode_batch(*batch).items()}
        for row, i in enumerate(index):
            results[i] = _translation(out, row, int(source_tokens[i]))
        if on_batch is not None:
            on_batch(len(index))
    return results


def _translation(out: dict, row: int, source_tokens: int) -> Translation:
    """Row `row` of one batch's decode_batch arrays as a Translation."""
    texts, scores, lengths = out["translations"], out["scores"], out["lengths"]
    aligned = target_tokens = None
    if "alignments" in out:
        columns = out["source_lengths"][row]
        aligned = [out["alignments"][row, n, :length, :columns]
                   for n, length in enumerate(lengths[row])]
        target_tokens = [int(n) for n in out["target_tokens"][row]]
    return Translation(texts=[t.decode("utf-8", errors="replace") for t in texts[row]],
                       scores=[float(s) for s in scores[row]],
                       lengths=[int(n) for n in lengths[row]],
                       source_tokens=source_tokens, alignments=aligned,
                       target_tokens=target_tokens)
