"""Packed rows versus bucketed batches: padding, packer speed, forward+backward throughput.

  python -m bench.packing --vocab=SPM_MODEL [--data=SPEC] [--row_lengths=256,128,64]
                          [--tokens_per_batch=4096] [--real_tokens=20000] [--xla=false,true]
                          [--rounds=2] [--nopadding]

For each row length L (max_length = L for both pipelines, so both keep the
same pairs): one epoch of pipeline.make_dataset (bucketed) and of
packing.make_dataset (packed), with their padding fraction (pad positions /
all positions, source and target_out together) and pairs per second through
the whole pipeline; then the packer alone (`pack_pairs` on pre-tokenised
chunks, one thread). Then, for the first L, forward+backward of the `small`
preset (the trainer's loss: label-smoothed, output layer on non-pad positions
in graph mode, on every position under XLA) on bucketed and packed batches
holding the same number of real target tokens (--real_tokens), timed in
alternation within one run; ratios are packed / bucketed real tokens per second.
"""

import os
import time

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_TRAIN = os.path.join(REPO, "..", "shared", "corpora", "libreoffice-help.en-de", "train.tsv")
EMBEDDED_TRAIN = os.path.join(REPO, "data", "libreoffice-help.en-de", "train.tsv")

DATA = flags.DEFINE_string("data", None, "corpus spec; default: shared train, else embedded")
VOCAB = flags.DEFINE_string("vocab", None, "SentencePiece .model (required)")
ROW_LENGTHS = flags.DEFINE_list("row_lengths", ["256", "128", "64"], "L = max_length")
TOKENS_PER_BATCH = flags.DEFINE_integer("tokens_per_batch", 4096, "positions per batch")
REAL_TOKENS = flags.DEFINE_integer("real_tokens", 20000, "real target tokens per timed pass")
XLA = flags.DEFINE_list("xla", ["false", "true"], "jit_compile settings of the step")
ROUNDS = flags.DEFINE_integer("rounds", 2, "alternating timed passes per mode")
PADDING = flags.DEFINE_bool("padding", True, "measure padding and packer speed for every L")


def epoch(dataset):
    """(pairs, real tokens, positions, batches, seconds) of one pass."""
    import numpy as np

    pairs = real = positions = batches = 0
    start = time.perf_counter()
    for batch in dataset.as_numpy_iterator():
        source, target = batch["source"], batch["target_out"]
        if "target_segments" in batch:
            pairs += int(sum(len(set(row[row > 0])) for row in batch["target_segments"]))
        else:
            pairs += source.shape[0]
        real += int(np.count_nonzero(source) + np.count_nonzero(target))
        positions += source.size + target.size
        batches += 1
    return pairs, real, positions, batches, time.perf_counter() - start


def packer_speed(pairs, vocab, length):
    """Pairs per second of `pack_pairs` alone on chunks of 4 tokenised batches."""
    import tensorflow as tf

    from tf_transformer.inputs import packing, pipeline

    dataset = pipeline.from_corpus(pairs).apply(pipeline.tokenize(vocab))
    dataset = dataset.apply(pipeline.filter_max_length(length))
    dataset = dataset.map(lambda p: {k: p[k] for k in ("source", "target_in", "target_out")})
    dataset = dataset.ragged_batch(packing.CHUNK_BATCHES).map(
        lambda b: {k: v.merge_dims(0, 1) for k, v in b.items()})
    chunks = list(dataset.take(30))
    pack = tf.function(lambda c: packing.pack_pairs(c, length, length), reduce_retracing=True)
    pack(chunks[0])
    count = sum(int(c["source"].nrows()) for c in chunks)
    start = time.perf_counter()
    for chunk in chunks:
        pack(chunk)["source"].numpy()
    return count / (time.perf_counter() - start)


def take_real(dataset, real_tokens):
    """Leading batches of `dataset` holding at least `real_tokens` non-pad target tokens."""
    import numpy as np

    batches, real = [], 0
    for batch in dataset:
        batches.append(batch)
        real += int(np.count_nonzero(batch["target_out"].numpy()))
        if real >= real_tokens:
            break
    return batches, real


def make_grads(model, xla):
    import tensorflow as tf

    from tf_transformer.config import PAD_ID
    from tf_transformer.training import losses

    def grads(batch):
        with tf.GradientTape() as tape:
            states = model.states(batch, training=True)
            labels = batch["target_out"]
            if not xla:
                positions = tf.where(tf.not_equal(labels, PAD_ID))
                states, labels = tf.gather_nd(states, positions), tf.gather_nd(labels, positions)
            loss, _ = losses.smoothed_cross_entropy(model.logits(states), labels, 0.1)
            loss = tf.reduce_sum(loss)
        return loss, tape.gradient(loss, model.trainable_variables)

    return tf.function(grads, jit_compile=xla, reduce_retracing=True)


def timed(fn, batches):
    start = time.perf_counter()
    for batch in batches:
        loss, grads = fn(batch)
    float(loss)
    grads[0].numpy()
    return time.perf_counter() - start


def main(argv):
    del argv
    import dataclasses

    from tf_transformer import presets
    from tf_transformer.config import DataConfig
    from tf_transformer.inputs import corpus, packing, pipeline, tokenizer
    from tf_transformer.model import build_model

    spec = DATA.value or (SHARED_TRAIN if os.path.exists(SHARED_TRAIN) else EMBEDDED_TRAIN)
    vocab = tokenizer.Tokenizer(VOCAB.value)
    pairs = corpus.read_corpus(spec)
    lengths = [int(x) for x in ROW_LENGTHS.value]
    datasets = {}
    for length in lengths:
        config = DataConfig(max_length=length, tokens_per_batch=TOKENS_PER_BATCH.value)
        bucketed = pipeline.make_dataset(pairs, vocab, config, training=True, repeat=False,
                                         count_skipped=False)
        packed = packing.make_dataset(pairs, vocab, config, repeat=False, count_skipped=False)
        datasets.setdefault("bucketed", bucketed)
        datasets.setdefault("packed", packed)
        if not PADDING.value:
            continue
        b, p = epoch(bucketed), epoch(packed)
        pad_b, pad_p = 1 - b[1] / b[2], 1 - p[1] / p[2]
        print(f"padding L={length} pairs={b[0]} bucketed_batches={b[3]} packed_batches={p[3]} "
              f"bucketed_pad={pad_b:.3f} packed_pad={pad_p:.3f} "
              f"pairs_per_row={p[0] / max(p[3] * (config.tokens_per_batch // length), 1):.2f} "
              f"real_per_position_ratio={(1 - pad_p) / (1 - pad_b):.2f} "
              f"pipeline_pairs_per_sec bucketed={b[0] / b[4]:.0f} packed={p[0] / p[4]:.0f}",
              flush=True)
        print(f"packer L={length} pack_pairs_pairs_per_sec={packer_speed(pairs, vocab, length):.0f}",
              flush=True)

    config = presets.get_preset("small", vocab.vocab_size)
    model = build_model(dataclasses.replace(config.model, dropout=0.0))
    for xla in [x == "true" for x in XLA.value]:
        runs = {}
        for mode, dataset in datasets.items():
            batches, real = take_real(dataset, REAL_TOKENS.value)
            fn = make_grads(model, xla)
            start = time.perf_counter()
            timed(fn, batches)  # traces (and compiles) every shape
            shapes = len({tuple(b["source"].shape) for b in batches})
            runs[mode] = [fn, batches, real, time.perf_counter() - start, shapes, []]
        for _ in range(ROUNDS.value):
            for run in runs.values():
                run[5].append(timed(run[0], run[1]))
        rate = {mode: run[2] / min(run[5]) for mode, run in runs.items()}
        print(f"fwd_bwd L={lengths[0]} xla={xla} "
              + " ".join(f"{m}: real_target_tokens={r[2]} batches={len(r[1])} shapes={r[4]} "
                         f"first_pass_s={r[3]:.1f} real_tokens_per_sec={rate[m]:.0f}"
                         for m, r in runs.items())
              + f" ratio_packed_over_bucketed={rate['packed'] / rate['bucketed']:.2f}", flush=True)


if __name__ == "__main__":
    flags.mark_flag_as_required("vocab")
    app.run(main)
