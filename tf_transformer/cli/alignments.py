"""Alignments as text, for `translate --with_alignments=hard|soft`.

Indices count SentencePiece tokens (not words), from 0, as the model sees them.
  hard: Pharaoh format, as fast_align, Moses and Marian write it: space-separated
    `i-j` pairs, source token i aligned to target token j, one pair per target
    token before EOS, i its alignment row's argmax over the source tokens (the
    source's EOS excluded), e.g. `0-0 1-1 3-2 2-3`.
  soft: the whole matrix, as Marian's soft alignments: one group per target token
    (EOS included, when the hypothesis ended by one) separated by spaces, each the
    weights over the source tokens (EOS last) separated by commas, 4 decimals; a
    group sums to 1.
An input without tokens gets an empty field.
"""

from __future__ import annotations

import numpy as np


def hard(alignment: np.ndarray, target_tokens: int) -> str:
    """alignment float32 [target tokens (+ EOS), source tokens + EOS] -> `i-j ...`."""
    sources = alignment.shape[1] - 1
    if sources < 1:
        return ""
    best = np.argmax(alignment[:target_tokens, :sources], axis=1)
    return " ".join(f"{i}-{j}" for j, i in enumerate(best))


def soft(alignment: np.ndarray, target_tokens: int) -> str:
    """alignment float32 [target tokens (+ EOS), source tokens + EOS] -> `w,w,... w,w,...`."""
    del target_tokens  # every row is written
    if alignment.shape[1] == 0:
        return ""
    return " ".join(",".join(f"{w:.4f}" for w in row) for row in alignment)


FORMATS = {"hard": hard, "soft": soft}
