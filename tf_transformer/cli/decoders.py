"""What the translate binary runs per batch besides the beam search: sampling, and the
search with its alignments (the DecodeBatch functions of cli/batching.py).

Sampling seeds each batch with its own seed, mixed from the user's seed and the
batch's text (`batch_seed`): the same input, seed and batch size give the same
outputs in any run, and two batches never share a random stream (with one seed for
all, the sentence in row r of every batch would be drawn from the same noise).
"""

from __future__ import annotations

import zlib

import tensorflow as tf

from tf_transformer.cli.batching import DecodeBatch
from tf_transformer.decoding.translator import Translator

_MASK = (1 << 64) - 1


def batch_seed(seed: int, texts: list[bytes]) -> int:
    """A 63-bit seed from `seed` and a batch's texts (SplitMix64's finalizer over both)."""
    x = (seed * 0x9E3779B97F4A7C15 + zlib.crc32(b"\n".join(texts))) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return (x ^ (x >> 31)) >> 1


def sampling(translator: Translator, topk: int, topp: float, temperature: float,
             seed: int) -> DecodeBatch:
    """One output drawn per sentence (Translator.sample; given target prefixes,
    sample_with_prefix), each batch seeded by batch_seed."""
    def decode(text: tf.Tensor, prefix: tf.Tensor | None = None) -> dict:
        batch = tf.constant(batch_seed(seed, list(text.numpy())), tf.int64)
        if prefix is not None:
            out = translator.sample_with_prefix(text, prefix, topk, topp, temperature, batch)
        else:
            out = translator.sample(text, topk, topp, temperature, batch)
        return {"translations": out["translation"][:, None], "scores": out["score"][:, None],
                "lengths": out["length"][:, None]}
    return decode


def with_alignments(translator: Translator, nbest: bool,
                    replace_unknown_target: bool) -> DecodeBatch:
    """The beam search's best (or n-best) with alignments; `replace_unknown_target`: the
    texts with <unk> replaced by their aligned source text (decoding/alignments.py)."""
    def decode(text: tf.Tensor) -> dict:
        if nbest:
            out = translator.translate_nbest_with_alignments(text)
        else:
            best = translator.translate_with_alignments(text)
            out = {"translations": best["translation"], "scores": best["score"],
                   "lengths": best["length"], "alignments": best["alignment"],
                   "target_tokens": best["target_tokens"],
                   "translations_unk_replaced": best["translation_unk_replaced"]}
            out = {k: v[:, None] for k, v in out.items()}
            out["source_lengths"] = best["source_length"]
        replaced = out.pop("translations_unk_replaced")
        if replace_unknown_target:
            out["translations"] = replaced
        return out
    return decode
