"""Packing: several (source, target) pairs per fixed-length row, one batch shape per run.

As in Flax's WMT example and Tensor2Tensor's `pack_dataset`. A packed batch is

  source, source_segments, source_positions                 int32 [rows, source_length]
  target_in, target_out, target_segments, target_positions  int32 [rows, target_length]

Segment ids number the pairs of a row 1, 2, ... on both sides (0: padding);
positions restart at 0 with each pair. Every pair keeps the pipeline's own
target_in = [BOS] + y and target_out = y + [EOS] (pipeline.tokenize), so each
target segment starts with BOS and padding is PAD_ID, which the loss weighs 0.
The model masks attention by segment (model/masks.py, `Transformer.states`).

The packer is first-fit over chunks of pairs: in stream order, each pair goes
to the first row of its chunk with room for both of its sides, or opens a new
row; a chunk's rows are emitted together. The per-pair loop runs on lengths
only (a `tf.while_loop` of a few vector ops); tokens are then placed by one
scatter per tensor. No pair is dropped or truncated: a side longer than its
row fails with InvalidArgumentError; `make_dataset` keeps rows >= max_length
and drops over-long pairs before packing, counted and logged as the bucketed
pipeline does (streamed.StreamTally).
"""

from __future__ import annotations

import tensorflow as tf

from tf_transformer.config import DataConfig
from tf_transformer.inputs import pipeline
from tf_transformer.inputs.corpus import Corpus
from tf_transformer.inputs.streamed import StreamedCorpus
from tf_transformer.inputs.tokenizer import Tokenizer

AUTOTUNE = tf.data.AUTOTUNE
CHUNK_BATCHES = 4  # tokenised batches (of pipeline.TOKENIZE_BATCH pairs) packed together
SOURCE_KEYS = ("source",)
TARGET_KEYS = ("target_in", "target_out")
PACKED_KEYS = ("source", "source_segments", "source_positions", "target_in", "target_out",
               "target_segments", "target_positions")


def first_fit(source_lengths: tf.Tensor, target_lengths: tf.Tensor, source_length: int,
              target_length: int) -> tf.Tensor:
    """[n], [n] int32 pair lengths -> [n] int32 row of each pair, rows numbered 0, 1, ...

    Rows not yet opened are empty, so the first row with room is an open one
    or the next new one: argmax over the `fits` vector finds either.
    """
    n = tf.size(source_lengths)

    def body(i, used_source, used_target, rows):
        ls, lt = source_lengths[i], target_lengths[i]
        fits = tf.logical_and(used_source <= source_length - ls, used_target <= target_length - lt)
        row = tf.argmax(tf.cast(fits, tf.int32), output_type=tf.int32)
        return (i + 1, tf.tensor_scatter_nd_add(used_source, [[row]], [ls]),
                tf.tensor_scatter_nd_add(used_target, [[row]], [lt]), rows.write(i, row))

    empty = tf.zeros([n], tf.int32)
    _, _, _, rows = tf.while_loop(lambda i, *_: i < n, body,
                                  (0, empty, empty, tf.TensorArray(tf.int32, size=n)))
    return rows.stack()


def _within_row(rows: tf.Tensor, values: tf.Tensor, num_rows: tf.Tensor) -> tf.Tensor:
    """Exclusive running sum of `values` [n] among earlier pairs of the same row. [n]"""
    order = tf.argsort(rows, stable=True)
    sorted_rows = tf.gather(rows, order)
    running = tf.cumsum(tf.gather(values, order), exclusive=True)
    start = tf.math.unsorted_segment_min(running, sorted_rows, num_rows)
    return tf.scatter_nd(order[:, tf.newaxis], running - tf.gather(start, sorted_rows),
                         tf.shape(values))


def _place(ragged: tf.RaggedTensor, rows, offsets, segments, shape):
    """Ragged [n, (len)] ids -> (ids, segment ids, positions), each int32 `shape` [rows, L]."""
    pair = tf.cast(ragged.value_rowids(), tf.int32)
    position = tf.range(tf.size(ragged.values)) - tf.gather(
        tf.cast(ragged.row_starts(), tf.int32), pair)
    index = tf.stack([tf.gather(rows, pair), tf.gather(offsets, pair) + position], axis=1)
    return (tf.scatter_nd(index, tf.cast(ragged.values, tf.int32), shape),
            tf.scatter_nd(index, tf.gather(segments, pair), shape),
            tf.scatter_nd(index, position, shape))


def pack_pairs(pairs: dict[str, tf.RaggedTensor], source_length: int,
               target_length: int) -> dict[str, tf.Tensor]:
    """One chunk: ragged {"source", "target_in", "target_out"} [n, (len)] -> PACKED_KEYS [rows, L].

    target_in and target_out of a pair have the same length (pipeline.tokenize).
    """
    source_lengths = tf.cast(pairs["source"].row_lengths(), tf.int32)
    target_lengths = tf.cast(pairs["target_in"].row_lengths(), tf.int32)
    checks = [
        tf.debugging.assert_less_equal(
            source_lengths, source_length,
            message=f"a source is longer than the packed row ({source_length}); "
                    "drop or cut pairs over the row length before packing"),
        tf.debugging.assert_less_equal(
            target_lengths, target_length,
            message=f"a target is longer than the packed row ({target_length}); "
                    "drop or cut pairs over the row length before packing")]
    with tf.control_dependencies(checks):
        rows = first_fit(source_lengths, target_lengths, source_length, target_length)
    num_rows = tf.reduce_max(tf.concat([rows, [-1]], 0)) + 1
    segments = _within_row(rows, tf.ones_like(rows), num_rows) + 1
    packed = {}
    for keys, lengths, width in ((SOURCE_KEYS, source_lengths, source_length),
                                 (TARGET_KEYS, target_lengths, target_length)):
        offsets = _within_row(rows, lengths, num_rows)
        for key in keys:
            ids, seg, pos = _place(pairs[key], rows, offsets, segments, [num_rows, width])
            packed[key] = ids
        side = keys[0].split("_")[0]
        packed[f"{side}_segments"], packed[f"{side}_positions"] = seg, pos
    return {k: tf.ensure_shape(packed[k], [None, source_length if k.startswith("source")
                                           else target_length]) for k in PACKED_KEYS}


def pack(source_length: int, target_length: int, chunk_batches: int = CHUNK_BATCHES
         ) -> pipeline.Transform:
    """Tokenised ragged batches (pipeline.tokenize) -> single packed rows (PACKED_KEYS, [L]).

    `chunk_batches` consecutive batches are packed together: bigger chunks
    leave fewer part-filled rows, at a longer first-fit loop per chunk.
    """
    def merge(batches):
        return {k: batches[k].merge_dims(0, 1) for k in SOURCE_KEYS + TARGET_KEYS}

    def chunk_pack(pairs):
        return pack_pairs(pairs, source_length, target_length)

    return lambda dataset: (
        dataset.map(lambda pairs: {k: pairs[k] for k in SOURCE_KEYS + TARGET_KEYS})
        .ragged_batch(chunk_batches).map(merge)
        .map(chunk_pack, num_parallel_calls=AUTOTUNE).unbatch())


@tf.autograph.experimental.do_not_convert  # its tf.data functions traced as written
def make_dataset(corpus: Corpus | StreamedCorpus, tokenizer: Tokenizer,
                 data_config: DataConfig, *, row_length: int | None = None,
                 input_context: tf.distribute.InputContext | None = None,
                 repeat: bool = True, count_skipped: bool = True,
                 chunk_batches: int = CHUNK_BATCHES) -> tf.data.Dataset:
    """Training batches of packed rows: PACKED_KEYS, int32 [tokens_per_batch // L, L].

    L = `row_length` (default max_length; never below it, so no pair that
    bucketing keeps is lost). Pairs over max_length are dropped and counted
    as in pipeline.make_dataset. Repeating, every batch has the same shape
    (the remainder is dropped); one pass keeps a last, shorter batch.
    """
    length = row_length or data_config.max_length
    if length < data_config.max_length:
        raise ValueError(f"row_length={length} < max_length={data_config.max_length}: pairs "
                         "the filter keeps would not fit; lower max_length instead")
    if data_config.tokens_per_batch < length:
        raise ValueError(f"tokens_per_batch={data_config.tokens_per_batch} < row length {length}")
    dataset = pipeline.token_pairs(corpus, tokenizer, data_config, training=True, repeat=repeat,
                                   input_context=input_context, count_skipped=count_skipped)
    dataset = dataset.apply(pack(length, length, chunk_batches))
    dataset = dataset.batch(data_config.tokens_per_batch // length, drop_remainder=repeat)
    return pipeline.finish(dataset, data_config.deterministic)


def dataset_fn(corpus: Corpus | StreamedCorpus, tokenizer: Tokenizer, data_config: DataConfig,
               row_length: int | None = None):
    """fn(input_context) -> this input pipeline's dataset, as pipeline.dataset_fn (training)."""
    def fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        return make_dataset(corpus, tokenizer, data_config, row_length=row_length,
                            input_context=input_context)

    return fn
