"""Decode throughput and per-step cost of the Translator's beam search.

  python -m bench.decode [--model_dir=DIR] [--jit_compile] [--repeats=3]

Without --model_dir: the `small` preset (3+3 layers, d_model 256, vocab 8000)
with random weights, which almost never emit EOS, so every hypothesis runs to
its maximum length (source + extra_length). Sentences per second then measure
the worst case, and the honest figure is ms per decoding step; the script
counts the steps actually run (a counter wrapped around decode_step, in an
untimed run of its own), so the per-step figures hold for a trained model
(--model_dir) too, whose outputs stop early. With parallel searches
(--parallel_searches, DecodeConfig's) steps add up over the searches, so
ms_per_step is per search step: compare sentences/s across that flag.
Sources are random token ids of a fixed length (EOS last).

Part 1: beam 4 and greedy (beam 1) at batch 32 and 1, sources of 32 tokens.
Part 3 (mixed): beam 4 and 1 at batch 32 and 1, sources of random lengths
(--mixed_lengths, uniform), so the maximum output lengths differ: finished
sentences leave the batch (decoding/live_rows.py). Every figure also gives
row_steps, the decoder rows computed, and live_row_steps, those of sentences
still decoding (counted on a graph-mode shrinking search of the same batch,
untimed); occupancy = live_row_steps / row_steps.
Part 2: beam 4, batch 32, sources of 16, 32, 64, 128 tokens. With the cache one
step costs the cached attention over the positions so far, so ms per step
should grow slowly (linearly in the cache length), not with the square of it.
Part `real` (--sources=FILE, --model_dir): every line of a text file, tokenized
by the model's vocabulary, sorted by length and decoded in batches of --batch
(beam 4 and greedy): sentences/s and occupancy of the search on real outputs,
and cores_busy: the process's CPU seconds per wall second (2.0 on 2 cores means
no thread waits; near 1.0, the step is a chain of ops that run one at a time).
Everything is traced (and with --jit_compile XLA-compiled) and run once before
timing (first_call_s: that run, compile included); the figure is the median
of --repeats runs.

With --profile: instead, where one search's time goes (beam 4, batch --batch,
random sources of 32; with --sources, --profile_batches real batches): the TensorFlow profiler's op self times grouped by op type
and the top ops by name (needs `xprof`, as bench.profile_train_step); with
--jit_compile, the executed HLO ops instead (XLA's own trace events, grouped
by name without the numeric suffix: all `gather_bitcast_fusion.N` together).
"""

import collections
import os
import random
import re
import statistics
import tempfile
import time

import numpy as np
import tensorflow as tf
from absl import app, flags

from tf_transformer import presets
from tf_transformer.config import EOS_ID, DecodeConfig
from tf_transformer.decoding.translator import Translator
from tf_transformer.model import build_model

MODEL_DIR = flags.DEFINE_string("model_dir", None, "A trained model; default random `small`.")
PRESET = flags.DEFINE_string("preset", "small", "Preset for random weights.")
JIT = flags.DEFINE_bool("jit_compile", False,
                        "The Translator's XLA search (DecodeConfig.jit_compile).")
PARALLEL = flags.DEFINE_integer("parallel_searches", DecodeConfig.parallel_searches,
                                "DecodeConfig.parallel_searches (graph mode).")
REPEATS = flags.DEFINE_integer("repeats", 3, "Timed runs per figure (median).")
EXTRA = flags.DEFINE_integer("extra_length", 50, "Max output = source + this.")
LENGTHS = flags.DEFINE_list("source_lengths", ["16", "32", "64", "128"], "Part 2 sources.")
PROFILE = flags.DEFINE_bool("profile", False, "Print an op profile of one search instead.")
TOP = flags.DEFINE_integer("top", 20, "Rows per profile table.")
PARTS = flags.DEFINE_list("parts", ["throughput", "by_length", "mixed"], "Parts to run.")
MIXED = flags.DEFINE_list("mixed_lengths", ["4", "64"], "Part 3: source lengths, min and max.")
SOURCES = flags.DEFINE_string(
    "sources", None, "A text file, one sentence per line (needs --model_dir): part `real` "
    "decodes all of it, and --profile profiles it, sorted by length in batches of --batch.")
BATCH = flags.DEFINE_integer("batch", 32, "Batch size of part `real` and of --profile.")
PROFILE_BATCHES = flags.DEFINE_integer(
    "profile_batches", 8, "--profile with --sources: this many batches, evenly spread over "
    "the sorted file.")
REAL_BEAMS = flags.DEFINE_list("real_beams", ["4", "1"], "Beam sizes of part `real`.")
DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"],
                          "DecodeConfig.dtype: the Translator's weights and products.")
INTRA_OP = flags.DEFINE_integer(
    "intra_op_threads", 0, "TensorFlow's intra-op threads (0: its default); 1 is the "
    "serving setting of decode_peer.py --threads=1.")


class _CountedTranslator(Translator):
    """The same search with its decode steps and decoder rows counted. The
    counters' variable updates order parallel searches one after the other, so
    timings come from an uncounted Translator and the counts from a separate run."""

    def __init__(self, model, *args, **kwargs):
        self.steps = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.rows = tf.Variable(0, dtype=tf.int64, trainable=False)

        def counted(ids, step, cache):
            self.steps.assign_add(1)
            self.rows.assign_add(tf.cast(tf.shape(ids)[0], tf.int64))
            return model.decode_step(ids, step, cache)

        super().__init__(model, *args, decode_step=counted, **kwargs)

    def count(self, sources) -> tuple[int, int]:
        """(decode steps, decoder rows) of searching each batch in `sources` once."""
        self.steps.assign(0)
        self.rows.assign(0)
        for source in sources:
            self.translate_ids(source)["lengths"].numpy()
        return int(self.steps.numpy()), int(self.rows.numpy())


def _translator(beam_size: int) -> tuple[Translator, _CountedTranslator]:
    """A translator to time and its counted twin on the same model."""
    decode = DecodeConfig(beam_size=beam_size, extra_length=EXTRA.value, jit_compile=JIT.value,
                          parallel_searches=PARALLEL.value, dtype=DTYPE.value)
    if MODEL_DIR.value:
        translator = Translator.from_model_dir(MODEL_DIR.value, decode_config=decode)
    else:  # ids only: no tokenizer needed
        random.seed(1)  # Keras draws its default seeds from Python's random
        config = presets.get_preset(PRESET.value)
        model = build_model(config.model, dtype=None if DTYPE.value == "float32" else DTYPE.value)
        translator = Translator(model, None, decode, config.data.max_length)
    counted = _CountedTranslator(translator.model, translator.tokenizer, decode,
                                 translator.max_source_length)
    return translator, counted


def _search_fn(translator: Translator):
    return lambda source: translator.translate_ids(source)["lengths"]


def _source(translator, batch: int, source_length: int, mixed: bool = False) -> tf.Tensor:
    rng = np.random.default_rng(0)
    source = rng.integers(4, translator.model.vocab_size, size=(batch, source_length))
    ends = (rng.integers(int(MIXED.value[0]), int(MIXED.value[1]) + 1, size=batch) if mixed
            else np.full([batch], source_length))
    source[np.arange(source_length) >= ends[:, None]] = 0  # PAD
    source[np.arange(batch), ends - 1] = EOS_ID
    return tf.constant(source.astype(np.int32))


def _live_row_steps(counted, source) -> int:
    """Rows of sentences still decoding: the graph-mode search shrinks to them."""
    search = counted.model_search.beam_search(source, counted.alpha, counted.extra_length, 1)
    if not getattr(search, "shrink", False):
        return -1  # a search that keeps finished sentences cannot count them
    model = counted.model
    cache = model.initial_cache(model.encode(source, training=False), source)
    counted.rows.assign(0)
    tf.function(lambda c: search.finish(search.advance(search.start(c))).lengths)(cache)
    return int(counted.rows.numpy())


def _figures(seconds, sentences, tokens, counted, sources, first_call, busy) -> dict:
    num_steps, row_steps = counted.count(sources)
    live = sum(_live_row_steps(counted, source) for source in sources)
    return {"sentences_per_sec": sentences / seconds, "ms_per_sentence": 1000 * seconds / sentences,
            "tokens_per_sec": tokens / seconds, "steps": num_steps,
            "ms_per_step": 1000 * seconds / max(num_steps, 1), "seconds": seconds,
            "row_steps": row_steps, "live_row_steps": live,
            "occupancy": live / row_steps if live > 0 else float("nan"),
            "first_call_s": first_call, "cores_busy": busy}


def _timed(translator, sources) -> tuple[float, int, float, float]:
    """All `sources` once untimed (traces, compiles), then --repeats timed passes:
    (median seconds, output tokens, first pass seconds, median cores busy)."""
    search = _search_fn(translator)
    start = time.perf_counter()
    for source in sources:
        search(source).numpy()
    first_call = time.perf_counter() - start
    times, busy = [], []
    for _ in range(REPEATS.value):
        start, cpu_start = time.perf_counter(), time.process_time()
        tokens = sum(int(search(source).numpy().sum()) for source in sources)
        times.append(time.perf_counter() - start)
        busy.append((time.process_time() - cpu_start) / times[-1])
    return statistics.median(times), tokens, first_call, statistics.median(busy)


def _measure(translator, counted, batch: int, source_length: int, mixed: bool = False) -> dict:
    source = _source(translator, batch, source_length, mixed)
    seconds, tokens, first_call, busy = _timed(translator, [source])
    return _figures(seconds, batch, tokens, counted, [source], first_call, busy)


def _real_batches(translator) -> list:
    """--sources as id batches of --batch sentences, sorted by tokenized length."""
    with open(SOURCES.value, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    ids = [translator.source_ids(tf.constant(lines[i:i + 256])) for i in range(0, len(lines), 256)]
    rows = [row[row > 0] for batch in ids for row in batch.numpy()]
    rows.sort(key=len)
    batches = []
    for i in range(0, len(rows), BATCH.value):
        chunk = rows[i:i + BATCH.value]
        width = max(len(r) for r in chunk)
        batches.append(tf.constant(np.stack([np.pad(r, (0, width - len(r))) for r in chunk])))
    return batches


def _measure_real(translator, counted, batches) -> dict:
    seconds, tokens, first_call, busy = _timed(translator, batches)
    sentences = sum(int(b.shape[0]) for b in batches)
    return _figures(seconds, sentences, tokens, counted, batches, first_call, busy)


def _print(name: str, figures: dict, **settings):
    print(" ".join([name] + [f"{k}={v}" for k, v in settings.items()]
                   + [f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                      for k, v in figures.items()]), flush=True)


def _profile(translator, counted, batch: int = 32, source_length: int = 32):
    from bench.timing import op_stats, xla_op_times

    if SOURCES.value:
        batches = _real_batches(translator)
        spread = max(1, len(batches) // PROFILE_BATCHES.value)
        sources = batches[::spread][:PROFILE_BATCHES.value]
        what = f"sources={SOURCES.value} batches={len(sources)} of {BATCH.value}"
    else:
        sources = [_source(translator, batch, source_length)]
        what = f"batch={batch} source_length={source_length}"
    search = _search_fn(translator)
    for source in sources:
        search(source)  # trace / compile outside the profile
    logdir = tempfile.mkdtemp(prefix="profile_decode_")
    tf.profiler.experimental.start(logdir)
    start = time.perf_counter()
    for source in sources:
        search(source).numpy()
    seconds = time.perf_counter() - start
    tf.profiler.experimental.stop()
    num_steps, _ = counted.count(sources)
    print(f"profile beam=4 {what} steps={num_steps} "
          f"ms_per_step={1000 * seconds / max(num_steps, 1):.2f} (under the profiler)")
    if JIT.value:
        totals = collections.Counter()
        for name, ms in xla_op_times(logdir).items():
            totals[re.sub(r"([._]\d+)+$", "", name)] += ms
        total = sum(totals.values())
        print(f"by HLO op (share of {total:.0f} ms of HLO time; MatMul/dot: the matrix products)")
        for name, ms in totals.most_common(TOP.value):
            print(f"  {name[:70]:70s} {ms / total:6.1%} {ms / max(num_steps, 1):7.2f} ms/step")
        return
    rows = op_stats(logdir)
    for key, title in (("type", "by op type"), ("operation", "by op")):
        totals = collections.Counter()
        for row in rows:
            name = row.get(key, "?")
            if key == "operation":  # the loop body's op, summed over parallel searches
                name = f'{name.rsplit("/while/", 1)[-1]} ({row.get("type", "?")})'
            totals[name] += float(row.get("total_self_time", 0) or 0)
        total = sum(totals.values())
        print(f"{title} (share of {total / 1000:.0f} ms self time; IDLE: executor threads waiting)")
        for name, micros in totals.most_common(TOP.value):
            print(f"  {name[:70]:70s} {micros / total:6.1%} {micros / 1000 / max(num_steps, 1):7.2f} ms/step")


def main(argv):
    del argv
    if INTRA_OP.value:
        tf.config.threading.set_intra_op_parallelism_threads(INTRA_OP.value)
    if PROFILE.value:
        if JIT.value:  # XLA's per-HLO trace events (read when the first compile starts)
            os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                       + " --xla_cpu_enable_xprof_traceme=true")
        _profile(*_translator(4), batch=BATCH.value)
        return
    weights = MODEL_DIR.value or f"random:{PRESET.value}"
    print(f"decode weights={weights} dtype={DTYPE.value} jit_compile={JIT.value} "
          f"cpus={os.cpu_count()} "
          f"extra_length={EXTRA.value} repeats={REPEATS.value}")
    translators = {k: _translator(k) for k in (4, 1)}
    for beam in (4, 1) if "throughput" in PARTS.value else ():
        for batch in (32, 1):
            _print("throughput", _measure(*translators[beam], batch, 32), beam=beam,
                   batch=batch, source_length=32)
    for beam in (4, 1) if "mixed" in PARTS.value else ():
        for batch in (32, 1):
            _print("mixed", _measure(*translators[beam], batch, int(MIXED.value[1]), mixed=True),
                   beam=beam, batch=batch, source_lengths="-".join(MIXED.value))
    if SOURCES.value:
        batches = _real_batches(translators[4][0])
        for beam in map(int, REAL_BEAMS.value):
            _print("real", _measure_real(*translators[beam], batches), beam=beam,
                   batch=BATCH.value)
    for length in map(int, LENGTHS.value) if "by_length" in PARTS.value else ():
        _print("by_length", _measure(*translators[4], 32, length), beam=4, batch=32,
               source_length=length)


if __name__ == "__main__":
    app.run(main)
