"""tf.data input: tokenise in the graph, bucket by length under a token budget.

Section 5.1 batches "sentence pairs ... together by approximate sequence length"
with about 25000 source and 25000 target tokens per batch. Here a pair becomes

  source     = x + [EOS]        target_in  = [BOS] + y        target_out = y + [EOS]

and its length is the longer of source and target_in. Pairs longer than
`max_length` are skipped in training, counted as they stream by and logged
(`streamed.StreamTally`; `stats.count_over_length` counts them ahead). The
others go to the bucket of the smallest boundary >= their length; boundaries
grow geometrically by `bucket_step` from `min_bucket` to `max_length` and are
rounded up to `bucket_multiple` (4: a multiple of 8 suits matmuls better but
costs 5 points of padding efficiency on short segments: BUILD.md, performance
decisions); `max_length` is always the last (with `static_batch`, the few
`static_boundaries` instead, and short batches filled with PAD rows: every
training batch is one of len(boundaries) shapes). A bucket of boundary L emits
batches of B = tokens_per_batch // L pairs, all three tensors padded with PAD_ID
to exactly [B, L]; so B * L <= tokens_per_batch (counted on the longer side,
padding included) and the trainer sees at most one shape per bucket (a shorter
B only for the last, partial batches of a finite epoch).

`tokens_per_batch` is per replica: `dataset_fn` builds one pipeline per input
worker (`tf.distribute.InputContext`), shards the pairs by input pipeline and
emits per-replica batches, which the trainer hands to its local replicas in
turn, copied to their devices a step ahead (training/input_state.py).

The pairs come from an in-memory `Corpus` or, for training corpora of any
size, a `StreamedCorpus` read from disk by tf.data (see streamed.py).

Training order: shard, shuffle (seeded, reshuffled each epoch), repeat, tokenise
(batched, parallel map), filter, pad to max_length and unbatch, bucket, cut to
the boundary, prefetch. `DataConfig.deterministic`
keeps the order of parallel maps, so a seed reproduces the batch sequence;
otherwise tf.data may reorder for speed. Evaluation (`training=False`) keeps
every pair: no shuffle, no repeat, deterministic, over-long sides truncated to
`max_length` (EOS/BOS kept) rather than dropped, and each batch also carries
"index" [B] int64, the pair's position in the corpus, to restore the order.

The builders run under `do_not_convert`: tf.data traces the functions given to
`map` as written, without autograph's rewriting of their source (control flow
here is explicit; the rewriting cost ~1.3 s of every pipeline's construction).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import tensorflow as tf

from tf_transformer.config import BOS_ID, EOS_ID, PAD_ID, DataConfig
from tf_transformer.inputs.corpus import Corpus
from tf_transformer.inputs.streamed import StreamedCorpus, StreamTally
from tf_transformer.inputs.subword_sampling import PairSampler, repeat_counting_passes
from tf_transformer.inputs.tokenizer import Tokenizer, TokenizerPair, sides

AUTOTUNE = tf.data.AUTOTUNE
Transform = Callable[[tf.data.Dataset], tf.data.Dataset]
TOKENIZE_BATCH = 256  # pairs per tokenizer call: amortises per-call overhead
KEYS = ("source", "target_in", "target_out")


def bucket_boundaries(max_length: int, min_bucket: int = 8, bucket_step: float = 1.1,
                      multiple: int = 4) -> list[int]:
    """Padded lengths of the buckets, ascending, ending at `max_length`."""
    boundaries, length = set(), float(min_bucket)
    while length < max_length:
        boundaries.add(min(max_length, multiple * math.ceil(length / multiple)))
        length *= bucket_step
    boundaries.add(max_length)
    return sorted(boundaries)


def static_bucket_boundaries(data_config: DataConfig) -> list[int]:
    """The static_batch boundaries below max_length, then max_length."""
    below = {b for b in data_config.static_boundaries if b < data_config.max_length}
    return sorted(below) + [data_config.max_length]


def padded_positions(boundaries: list[int], lengths: np.ndarray, tokens_per_batch: int) -> float:
    """Positions per pair (the boundary, plus its share of the budget's unused
    remainder) summed over `lengths` [n]: what bucketing costs (longer side)."""
    bounds = np.array(sorted(boundaries))
    chosen = bounds[np.searchsorted(bounds, lengths)]
    rows = tokens_per_batch // chosen
    return float(np.sum(chosen + (tokens_per_batch - rows * chosen) / rows))


def best_boundaries(lengths: np.ndarray, count: int, max_length: int, tokens_per_batch: int,
                    multiple: int = 8) -> list[int]:
    """The `count` boundaries (multiples of `multiple`, ending at max_length) with
    the fewest padded positions for these pair lengths [n]: dynamic programming
    over the length histogram."""
    lengths = np.asarray(lengths)
    lengths = lengths[lengths <= max_length]
    hist = np.bincount(lengths, minlength=max_length + 1)
    pairs, tokens = np.cumsum(hist), np.cumsum(hist * np.arange(max_length + 1))
    cands = sorted(set(range(multiple, max_length, multiple)) | {max_length})

    def cost(lo, hi):  # pairs with lo < length <= hi, in bucket hi
        rows = tokens_per_batch // hi
        per_pair = hi + (tokens_per_batch - rows * hi) / rows
        return (pairs[hi] - pairs[lo]) * per_pair - (tokens[hi] - tokens[lo])

    best = [(cost(0, c), [c]) for c in cands]  # 1 bucket ending at each candidate
    for _ in range(count - 1):
        best = [min([best[i][0] + cost(cands[i], c), best[i][1] + [c]] for i in range(j))
                if j else best[0] for j, c in enumerate(cands)]
    return best[-1][1]


def from_corpus(corpus: Corpus | StreamedCorpus, shard: tuple[int, int] = (0, 1),
                tally: StreamTally | None = None) -> tf.data.Dataset:
    """One pass of pairs as {"index": int64, "source": string, "target": string}.

    `shard=(i, n)` keeps pairs i, i+n, ...: sharding the Python lists (or the
    file's lines), rather than the pairs, keeps each worker from tokenising the
    others' pairs. A `StreamedCorpus` is read from disk, counted into `tally`;
    its "index" is the line number.
    """
    if isinstance(corpus, StreamedCorpus):
        return corpus.pairs(shard, tally)
    index, num = shard
    return tf.data.Dataset.from_tensor_slices({
        "index": np.arange(index, len(corpus), num, dtype=np.int64),
        "source": np.array(corpus.sources[index::num], dtype=object),
        "target": np.array(corpus.targets[index::num], dtype=object),
    })


def tokenize(tokenizer: Tokenizer | TokenizerPair, truncate_to: int | None = None,
             sampler: PairSampler | None = None) -> Transform:
    """String pairs -> batches of ragged int32 ids, TOKENIZE_BATCH pairs at a time.

    Each side with its own vocabulary when `tokenizer` is a TokenizerPair (the
    other functions here pass `tokenizer` on as they get it).

    Output: {"index", "source", "target_in", "target_out"}, ids ragged [n, (len)].
    Batching amortises the tokenizer call; the map runs in parallel.
    `truncate_to` cuts each side to that many tokens, EOS/BOS included. A
    `sampler` resegments both sides (BPE-dropout), keyed by the pairs' "index"
    and "epoch" (subword_sampling.repeat_counting_passes adds it).
    """
    keep = None if truncate_to is None else truncate_to - 1
    source_tokenizer, target_tokenizer = sides(tokenizer)

    def encode(pairs):
        x = source_tokenizer.tokenize(pairs["source"])
        y = target_tokenizer.tokenize(pairs["target"])
        if sampler is not None:
            x, y = sampler(x, y, pairs["index"], pairs["epoch"])
        if keep is not None:
            x, y = x[:, :keep], y[:, :keep]
        eos = tf.fill([x.nrows(), 1], EOS_ID)
        bos = tf.fill([y.nrows(), 1], BOS_ID)
        return {"index": pairs["index"],
                "source": tf.concat([x, eos], axis=1),
                "target_in": tf.concat([bos, y], axis=1),
                "target_out": tf.concat([y, eos], axis=1)}

    return lambda dataset: (dataset.batch(TOKENIZE_BATCH)
                            .map(encode, num_parallel_calls=AUTOTUNE))


def pair_lengths(pairs: dict[str, tf.Tensor]) -> tf.Tensor:
    """The longer side, EOS/BOS included: what bucketing and the budget count. [n]"""
    return tf.maximum(pairs["source"].row_lengths(), pairs["target_in"].row_lengths())


def filter_max_length(max_length: int, tally: StreamTally | None = None) -> Transform:
    """Drops pairs whose longer side exceeds max_length, a whole tokenised batch at once.

    With a `tally`, the dropped pairs are counted into it as they go by.
    """
    def keep(pairs):
        mask = pair_lengths(pairs) <= max_length
        if tally is not None:
            over = tf.reduce_sum(tf.cast(~mask, tf.int64))
            counted = tf.py_function(tally.record_lengths, [tf.size(mask), over], tf.int64)
            with tf.control_dependencies([counted]):
                mask = tf.identity(mask)
        rows = tf.where(mask)[:, 0]  # a gather: a tenth of tf.ragged.boolean_mask's tracing
        return {k: tf.gather(v, rows) for k, v in pairs.items()}

    return lambda dataset: dataset.map(keep, num_parallel_calls=AUTOTUNE)


def pad_and_unbatch(max_length: int) -> Transform:
    """Ragged batches -> single pairs padded to [max_length], with their "length".

    Fixed-width rows make the per-pair stage a plain slice (unbatching ragged
    rows costs several times more), and a batch of them is cut to its bucket.
    """
    def pad(pairs):
        padded = {k: pairs[k].to_tensor(PAD_ID, shape=[None, max_length]) for k in KEYS}
        return {"index": pairs["index"], "length": pair_lengths(pairs), **padded}

    return lambda dataset: dataset.map(pad, num_parallel_calls=AUTOTUNE).unbatch()


def cut(batch: dict[str, tf.Tensor], length: tf.Tensor) -> dict[str, tf.Tensor]:
    return {"index": batch["index"], **{k: batch[k][:, :length] for k in KEYS}}


def fill_rows(batch: dict[str, tf.Tensor], rows: tf.Tensor) -> dict[str, tf.Tensor]:
    """Appends PAD rows up to `rows` (index -1): they have no target token, so no
    weight in the loss. [b, L] -> [rows, L]."""
    missing = rows - tf.shape(batch["index"], out_type=tf.int64)[0]
    filled = {k: tf.pad(batch[k], [[0, missing], [0, 0]], constant_values=PAD_ID) for k in KEYS}
    return {"index": tf.pad(batch["index"], [[0, missing]], constant_values=-1), **filled}


def bucket_by_length(boundaries: list[int], tokens_per_batch: int,
                     static: bool = False) -> Transform:
    """Groups padded pairs by bucket into [tokens_per_batch // L, L] batches.

    Uses `group_by_window`: one open window per bucket, emitted when full (or at
    the end of a finite input), then cut from max_length to the boundary L.
    `static`: a short last batch is filled with PAD rows to the full shape.
    """
    if tokens_per_batch < boundaries[-1]:
        raise ValueError(f"tokens_per_batch={tokens_per_batch} < longest bucket {boundaries[-1]}")
    bounds = tf.constant(boundaries, tf.int64)
    batch_sizes = tf.constant([tokens_per_batch // b for b in boundaries], tf.int64)

    def key_fn(pair):  # the first boundary >= length
        return tf.reduce_sum(tf.cast(bounds < pair["length"], tf.int64))

    def reduce_fn(key, window):
        batches = window.batch(batch_sizes[key])
        if static:
            batches = batches.map(lambda batch: fill_rows(batch, batch_sizes[key]))
        return batches.map(lambda batch: cut(batch, bounds[key]))

    return lambda dataset: dataset.group_by_window(
        key_fn, reduce_fn, window_size_func=lambda key: batch_sizes[key])


def drop_index() -> Transform:
    return lambda dataset: dataset.map(lambda batch: {k: batch[k] for k in KEYS})


def token_pairs(corpus: Corpus | StreamedCorpus, tokenizer: Tokenizer, data_config: DataConfig,
                *, training: bool, repeat: bool,
                input_context: tf.distribute.InputContext | None = None,
                count_skipped: bool = True) -> tf.data.Dataset:
    """This worker's shard as tokenised ragged batches (tokenize's keys).

    Training: shuffled (seeded, reshuffled each epoch) before `repeat`, resegmented
    by BPE-dropout when `subword_sampling` > 0, pairs over max_length (as sampled)
    dropped (counted and logged as they stream by with `count_skipped`).
    Evaluation: in order, over-long sides truncated, never sampled.
    """
    shard = (0, 1)
    if input_context is not None:
        shard = (input_context.input_pipeline_id, input_context.num_input_pipelines)
    tally = StreamTally(f"{corpus.name} [{shard[0]}/{shard[1]}]")
    dataset = from_corpus(corpus, shard, tally)
    if training:
        dataset = dataset.shuffle(data_config.shuffle_buffer, seed=data_config.seed,
                                  reshuffle_each_iteration=True)
    sampling = training and data_config.subword_sampling > 0
    if sampling:  # the draws are keyed by the pass: it is counted (and checkpointed)
        dataset = repeat_counting_passes(dataset, repeat)
    elif repeat:
        dataset = dataset.repeat()
    if not training:
        return dataset.apply(tokenize(tokenizer, truncate_to=data_config.max_length))
    source_tokenizer, target_tokenizer = sides(tokenizer)
    sampler = PairSampler(source_tokenizer.model_proto, target_tokenizer.model_proto,
                          data_config.subword_sampling, data_config.seed) if sampling else None
    dataset = dataset.apply(tokenize(tokenizer, sampler=sampler))
    return dataset.apply(filter_max_length(data_config.max_length,
                                           tally if count_skipped else None))


def finish(dataset: tf.data.Dataset, deterministic: bool) -> tf.data.Dataset:
    """Options and prefetch shared by every batched pipeline."""
    options = tf.data.Options()
    options.deterministic = deterministic
    # The skip counters (py_function) are the only external state: an iterator
    # checkpoint leaves them out, and they restart from zero after a restore.
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    return dataset.with_options(options).prefetch(AUTOTUNE)


@tf.autograph.experimental.do_not_convert  # its tf.data functions traced as written
def make_dataset(corpus: Corpus | StreamedCorpus, tokenizer: Tokenizer,
                 data_config: DataConfig, *, training: bool,
                 input_context: tf.distribute.InputContext | None = None,
                 repeat: bool | None = None, count_skipped: bool = True) -> tf.data.Dataset:
    """Batches of {"source", "target_in", "target_out"}: int32 [B, L], L a bucket boundary.

    `repeat` defaults to `training`. In evaluation the batches also hold
    "index" [B] (see the module docstring). `count_skipped` counts and logs,
    as they stream by, the training pairs dropped as over `max_length`.
    """
    repeat = training if repeat is None else repeat
    static = training and data_config.static_batch  # evaluation keeps its batches
    boundaries = (static_bucket_boundaries(data_config) if static else bucket_boundaries(
        data_config.max_length, data_config.min_bucket, data_config.bucket_step,
        data_config.bucket_multiple))
    dataset = token_pairs(corpus, tokenizer, data_config, training=training, repeat=repeat,
                          input_context=input_context, count_skipped=count_skipped)
    dataset = dataset.apply(pad_and_unbatch(data_config.max_length))
    dataset = dataset.apply(bucket_by_length(boundaries, data_config.tokens_per_batch, static))
    if training:
        dataset = dataset.apply(drop_index())
    return finish(dataset, data_config.deterministic or not training)


def dataset_fn(corpus: Corpus | StreamedCorpus, tokenizer: Tokenizer, data_config: DataConfig,
               training: bool) -> Callable[[tf.distribute.InputContext], tf.data.Dataset]:
    """fn(input_context) -> this input pipeline's dataset (the trainer's `dataset_fn`, or
    an evaluation shard); tokens_per_batch is per replica."""
    def fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        return make_dataset(corpus, tokenizer, data_config, training=training,
                            input_context=input_context)

    return fn
