"""Figures about a corpus and its batches, for data/corpus_stats.py, bench/ and tests.

Nothing here runs in training: each helper makes its own pass over a corpus or
over a finite batch dataset. `make_plain_dataset` is the unbucketed baseline
that the bucketing figures are compared with.
"""

from __future__ import annotations

import itertools
import time

import numpy as np
import tensorflow as tf

from tf_transformer.config import PAD_ID, DataConfig
from tf_transformer.inputs.corpus import Corpus
from tf_transformer.inputs.pipeline import (AUTOTUNE, TOKENIZE_BATCH, cut, drop_index,
                                            filter_max_length, from_corpus, pad_and_unbatch,
                                            tokenize)
from tf_transformer.inputs.tokenizer import Tokenizer, TokenizerPair, sides


@tf.autograph.experimental.do_not_convert  # its tf.data functions traced as written
def make_plain_dataset(corpus: Corpus, tokenizer: Tokenizer | TokenizerPair,
                       data_config: DataConfig,
                       batch_size: int | None = None) -> tf.data.Dataset:
    """The baseline without bucketing, for comparison: one epoch, shuffled.

    A fixed number of pairs per batch, by default the largest that keeps the
    longest pair's batch within tokens_per_batch (tokens_per_batch // longest),
    all three tensors padded to the batch's longest pair (its longer side), as
    `padded_batch` would, but with one L for source and target as in buckets.
    """
    if batch_size is None:
        source_lengths, target_lengths = token_lengths(corpus, tokenizer)
        lengths = np.maximum(source_lengths, target_lengths) + 1
        longest = int(lengths[lengths <= data_config.max_length].max())
        batch_size = max(1, data_config.tokens_per_batch // longest)
    dataset = (from_corpus(corpus)
               .shuffle(data_config.shuffle_buffer, seed=data_config.seed)
               .apply(tokenize(tokenizer))
               .apply(filter_max_length(data_config.max_length))
               .apply(pad_and_unbatch(data_config.max_length))
               .batch(batch_size)
               .map(lambda batch: cut(batch, tf.reduce_max(batch["length"])))
               .apply(drop_index()))
    return dataset.prefetch(AUTOTUNE)


@tf.autograph.experimental.do_not_convert  # its tf.data functions traced as written
def token_lengths(corpus: Corpus, tokenizer: Tokenizer | TokenizerPair
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Tokens per source and per target, without EOS/BOS: int64 [num_pairs] each."""
    source_tokenizer, target_tokenizer = sides(tokenizer)

    def lengths(pairs):
        return (source_tokenizer.tokenize(pairs["source"]).row_lengths(),
                target_tokenizer.tokenize(pairs["target"]).row_lengths())

    dataset = (from_corpus(corpus).batch(4 * TOKENIZE_BATCH)
               .map(lengths, num_parallel_calls=AUTOTUNE, deterministic=True))
    source, target = zip(*dataset.as_numpy_iterator())
    return np.concatenate(source), np.concatenate(target)


def count_over_length(corpus: Corpus, tokenizer: Tokenizer | TokenizerPair,
                      max_length: int) -> int:
    """Pairs a training pipeline skips: a side over max_length with its EOS/BOS."""
    source, target = token_lengths(corpus, tokenizer)
    return int(np.sum(np.maximum(source, target) + 1 > max_length))


def epoch_stats(dataset: tf.data.Dataset) -> dict[str, float]:
    """Figures of one finite epoch of batches (see data/corpus_stats.py).

    padding_efficiency = non-pad tokens / all positions, source and target_out
    together; max_batch_tokens = the largest B * (longer side's padded length);
    shapes = distinct batch shapes, lengths = distinct padded lengths L.
    """
    examples = batches = nonpad = positions = max_tokens = 0
    shapes, lengths = set(), set()
    for batch in dataset.as_numpy_iterator():
        source, target = batch["source"], batch["target_out"]
        batches += 1
        examples += source.shape[0]
        nonpad += int(np.count_nonzero(source != PAD_ID) + np.count_nonzero(target != PAD_ID))
        positions += source.size + target.size
        max_tokens = max(max_tokens, source.shape[0] * max(source.shape[1], target.shape[1]))
        shapes.add((source.shape, target.shape))
        lengths.add(source.shape[1])
    return {"examples": examples, "batches": batches, "tokens": nonpad,
            "max_batch_tokens": max_tokens, "shapes": len(shapes), "lengths": len(lengths),
            "padding_efficiency": round(nonpad / max(positions, 1), 4)}


def tokens_per_second(dataset: tf.data.Dataset, max_batches: int | None = None) -> dict[str, float]:
    """Throughput of a finite batch dataset: non-pad source + target tokens per second.

    The clock starts once the first batch is out (tracing and start-up excluded);
    that batch is not counted. Reused by bench/ to compare with a training step.
    """
    iterator = iter(dataset)
    next(iterator)
    tokens = batches = 0
    start = time.perf_counter()
    for batch in itertools.islice(iterator, max_batches):
        tokens += int(np.count_nonzero(batch["source"].numpy()) +
                      np.count_nonzero(batch["target_out"].numpy()))
        batches += 1
    seconds = time.perf_counter() - start
    return {"tokens_per_second": round(tokens / max(seconds, 1e-9)), "tokens": tokens,
            "batches": batches, "seconds": round(seconds, 3)}
