"""Pairs in, one line of figures per pair out: the score binary's loop.

The pairs come from a TSV or two line-aligned files (the corpus specs of
inputs/corpus.py, `:reverse` included) read with the corpus rules: a bad line
(no_tab, extra_tab, empty_side, invalid_utf8, too_long) is skipped and counted,
never fatal; blank lines are skipped. Only a source mostly bad after the whole
pass raises CorpusError (line_rules.Tally). Lines are read as they come; every
`chunk_size` pairs are sorted by length, scored in batches (Translator.score) and
written in input order, each as

  index<TAB>log_prob<TAB>tokens<TAB>log_prob_per_token<TAB>score

index: the pair's line in the input, from 0 (skipped lines leave gaps);
log_prob: log P(target + EOS | source), natural log; tokens: target tokens with
EOS; log_prob_per_token: their ratio; score: log_prob / ((5 + tokens) / 6) ** alpha,
the beam search's GNMT-penalized score at the alpha in use.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Iterator, TextIO

import numpy as np
import tensorflow as tf
from absl import logging

from tf_transformer.decoding.translator import Translator
from tf_transformer.inputs import corpus, line_rules

COLUMNS = ("index", "log_prob", "tokens", "log_prob_per_token", "score")


def read_pairs(spec: str, max_chars: int = line_rules.DEFAULT_MAX_CHARS
               ) -> tuple[Iterator[tuple[int, str, str]], line_rules.Tally]:
    """(index, source, target) of each valid line of a TSV or SRC,TGT spec, lazily, and
    the Tally that counts the rest (check it once the iterator is exhausted)."""
    paths, reverse = corpus.split_spec(spec)
    tally = line_rules.Tally(",".join(paths), max_chars)
    lines = corpus.scan_parallel(*paths, tally) if len(paths) == 2 else corpus.scan_tsv(
        paths[0], tally)

    def pairs():
        for index, pair in enumerate(lines):
            if pair is not None:
                source, target = pair[::-1] if reverse else pair
                yield index, source, target
    return pairs(), tally


@dataclasses.dataclass
class Totals:
    pairs: int = 0
    log_prob: float = 0.0
    tokens: int = 0


def score_chunk(translator: Translator, chunk: list[tuple[int, str, str]],
                batch_size: int) -> dict:
    """The figures of `chunk`'s pairs, in its order: {column: np.ndarray [len(chunk)]}."""
    order = np.argsort([len(s) + len(t) for _, s, t in chunk], kind="stable")
    figures = {name: np.zeros(len(chunk), np.float64) for name in COLUMNS[1:]}
    for start in range(0, len(order), batch_size):
        index = order[start:start + batch_size]
        out = translator.score(tf.constant([chunk[i][1] for i in index]),
                               tf.constant([chunk[i][2] for i in index]))
        for name in COLUMNS[1:]:
            figures[name][index] = out[name].numpy()
    figures["index"] = np.array([i for i, _, _ in chunk])
    return figures


def score_stream(translator: Translator, spec: str, out: TextIO, batch_size: int,
                 chunk_size: int = 4096) -> Totals:
    """Scores every valid pair of `spec` into `out` (module docstring); the totals over
    the pairs scored. Skipped lines are logged by reason at the end."""
    pairs, tally = read_pairs(spec)
    totals = Totals()
    while chunk := list(itertools.islice(pairs, chunk_size)):
        figures = score_chunk(translator, chunk, batch_size)
        for row in range(len(chunk)):
            out.write(f"{figures['index'][row]}\t{figures['log_prob'][row]:.6f}\t"
                      f"{int(figures['tokens'][row])}\t{figures['log_prob_per_token'][row]:.6f}"
                      f"\t{figures['score'][row]:.6f}\n")
        out.flush()
        totals.pairs += len(chunk)
        totals.log_prob += float(figures["log_prob"].sum())
        totals.tokens += int(figures["tokens"].sum())
    skipped = tally.check(complete=False)
    bad = {reason: n for reason, n in skipped.items() if reason != "blank"}
    if bad:
        logging.warning("%s: %d pairs scored, %d lines skipped %s", tally.name, totals.pairs,
                        sum(bad.values()), bad)
    return totals
