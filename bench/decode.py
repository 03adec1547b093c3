"""Decode throughput and per-step cost of the Translator's beam search.

  python -m bench.decode [--model_dir=DIR] [--jit_compile] [--repeats=3]

Without --model_dir: the `small` preset with random weights, which almost never emit
EOS, so every hypothesis runs to source + extra_length: a worst case, and the honest
figure is ms per decoding step, counted on the steps actually run (a counter around
decode_step, in an untimed run of its own), which holds for a trained model too. With
--parallel_searches, ms_per_step is per search step: compare sentences/s across it.

Part `throughput`: beam 4 and greedy (beam 1) at batch 32 and 1, random sources of 32
tokens (EOS last). Part `real` (--sources=FILE, --model_dir): every line of a text file,
tokenized by the model's vocabulary, sorted by length and decoded in batches of --batch
(beam 4 and greedy). Every figure also gives row_steps, the decoder rows computed;
live_row_steps, those of sentences still decoding (finished ones leave the batch:
decoding/live_rows.py; counted on a graph-mode search, untimed); occupancy, their ratio;
and cores_busy: the process's CPU seconds per wall second (2.0 on 2 cores means no thread
waits; near 1.0, the step is a chain of ops that run one at a time). Everything is traced
(with --jit_compile, XLA-compiled) and run once before timing (first_call_s: that run,
compile included); the figure is the median of --repeats runs. One intra-op thread, the
serving setting of decode_peer.py --threads=1: TF_NUM_INTRAOP_THREADS=1 in the environment.

With --profile: instead, where one search's time goes (beam 4, batch --batch, random
sources of 32; with --sources, --profile_batches real batches): the TensorFlow profiler's
op self times grouped by op type and the top ops by name (needs `xprof`; graph mode).
"""

import collections
import glob
import json
import os
import random
import statistics
import tempfile
import time

from absl import app, flags

from tf_transformer import presets, process_defaults
from tf_transformer.config import EOS_ID, DecodeConfig

MODEL_DIR = flags.DEFINE_string("model_dir", None, "A trained model; default random `small`.")
PRESET = flags.DEFINE_string("preset", "small", "Preset for random weights.")
JIT = flags.DEFINE_bool("jit_compile", False, "The XLA search (DecodeConfig.jit_compile).")
PARALLEL = flags.DEFINE_integer("parallel_searches", DecodeConfig.parallel_searches,
                                "DecodeConfig.parallel_searches (graph mode).")
REPEATS = flags.DEFINE_integer("repeats", 3, "Timed runs per figure (median).")
EXTRA = flags.DEFINE_integer("extra_length", 50, "Max output = source + this.")
PROFILE = flags.DEFINE_bool("profile", False, "Print an op profile of one search instead.")
PARTS = flags.DEFINE_list("parts", ["throughput"], "Parts to run (`real`: see --sources).")
flags.register_validator("parts", lambda parts: set(parts) <= {"throughput", "real"},
                         "--parts: a comma list of throughput, real")
SOURCES = flags.DEFINE_string("sources", None, "A text file, one sentence per line (needs "
                              "--model_dir): part `real` and --profile decode it.")
BATCH = flags.DEFINE_integer("batch", 32, "Batch size of part `real` and of --profile.")
PROFILE_BATCHES = flags.DEFINE_integer("profile_batches", 8, "--profile with --sources: this "
                                       "many batches, evenly spread over the sorted file.")
DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"],
                          "DecodeConfig.dtype: the Translator's weights and products.")


class _StepCounter:
    """The model's decode_step with its calls and decoder rows counted. Its variable updates
    order parallel searches, so timings come from an uncounted Translator, counts from a run."""

    def __init__(self, model):
        import tensorflow as tf

        self.model = model
        self.steps = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.rows = tf.Variable(0, dtype=tf.int64, trainable=False)

    def __call__(self, ids, step, cache):
        import tensorflow as tf

        self.steps.assign_add(1)
        self.rows.assign_add(tf.cast(tf.shape(ids)[0], tf.int64))
        return self.model.decode_step(ids, step, cache)

    def count(self, translator, sources) -> tuple[int, int]:
        """(decode steps, decoder rows) of `translator` searching each batch once."""
        self.steps.assign(0)
        self.rows.assign(0)
        for source in sources:
            translator.translate_ids(source)["lengths"].numpy()
        return int(self.steps.numpy()), int(self.rows.numpy())


def _translator(beam_size: int) -> tuple:
    """(a Translator to time, its counted twin on the same model, the twin's counter)."""
    from tf_transformer.decoding.translator import Translator
    from tf_transformer.model import build_model
    from tf_transformer.model_dir import ModelDir

    decode = DecodeConfig(beam_size=beam_size, extra_length=EXTRA.value, jit_compile=JIT.value,
                          parallel_searches=PARALLEL.value, dtype=DTYPE.value)
    if MODEL_DIR.value:
        translator = Translator.from_model_dir(ModelDir(MODEL_DIR.value), decode_config=decode)
    else:  # ids only: no tokenizer needed
        random.seed(1)  # Keras draws its default seeds from Python's random
        config = presets.get_preset(PRESET.value)
        model = build_model(config.model, dtype=None if DTYPE.value == "float32" else DTYPE.value)
        translator = Translator(model, None, decode, config.data.max_length)
    counter = _StepCounter(translator.model)
    counted = Translator(translator.model, translator.tokenizer, decode,
                         translator.max_source_length, decode_step=counter)
    return translator, counted, counter


def _search_fn(translator):
    return lambda source: translator.translate_ids(source)["lengths"]


def _seconds(search, sources) -> float:
    """Wall seconds of `search` over every batch of `sources`, its outputs read."""
    start = time.perf_counter()
    for source in sources:
        search(source).numpy()
    return time.perf_counter() - start


def _source(translator, batch: int, source_length: int):
    """Random ids of `source_length` tokens, EOS last."""
    import numpy as np
    import tensorflow as tf

    source = np.random.default_rng(0).integers(4, translator.model.vocab_size,
                                               size=(batch, source_length))
    source[:, -1] = EOS_ID
    return tf.constant(source.astype(np.int32))


def _live_row_steps(counted, counter, source) -> int:
    """Rows of sentences still decoding: the graph-mode search shrinks to them."""
    import tensorflow as tf

    search = counted.model_search.beam_search(source, counted.alpha, counted.extra_length, 1)
    if not getattr(search, "shrink", False):
        return -1  # a search that keeps finished sentences cannot count them
    model = counted.model
    cache = model.initial_cache(model.encode(source, training=False), source)
    counter.rows.assign(0)
    tf.function(lambda c: search.finish(search.advance(search.start(c))).lengths)(cache)
    return int(counter.rows.numpy())


def _measure(translator, counted, counter, sources, sentences: int) -> dict:
    """All `sources` once untimed (traces, compiles), then --repeats timed passes (the
    median), and the steps and rows of a counted pass."""
    search = _search_fn(translator)
    first_call = _seconds(search, sources)
    times, busy = [], []
    for _ in range(REPEATS.value):
        start, cpu_start = time.perf_counter(), time.process_time()
        tokens = sum(int(search(source).numpy().sum()) for source in sources)
        times.append(time.perf_counter() - start)
        busy.append((time.process_time() - cpu_start) / times[-1])
    seconds = statistics.median(times)
    num_steps, row_steps = counter.count(counted, sources)
    live = sum(_live_row_steps(counted, counter, source) for source in sources)
    return {"sentences_per_sec": sentences / seconds, "ms_per_sentence": 1000 * seconds / sentences,
            "tokens_per_sec": tokens / seconds, "steps": num_steps,
            "ms_per_step": 1000 * seconds / max(num_steps, 1), "seconds": seconds,
            "row_steps": row_steps, "live_row_steps": live,
            "occupancy": live / row_steps if live > 0 else float("nan"),
            "first_call_s": first_call, "cores_busy": statistics.median(busy)}


def _real_batches(translator) -> list:
    """--sources as id batches of --batch sentences, sorted by tokenized length."""
    import numpy as np
    import tensorflow as tf

    with open(SOURCES.value, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    lengths = translator.tokenizer.tokenize(tf.constant(lines)).row_lengths().numpy()
    lines = [lines[i] for i in np.argsort(lengths, kind="stable")]
    return [translator.source_ids(tf.constant(lines[i:i + BATCH.value]))
            for i in range(0, len(lines), BATCH.value)]


def _print(name: str, figures: dict, **settings):
    print(" ".join([name] + [f"{k}={v}" for k, v in settings.items()]
                   + [f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                      for k, v in figures.items()]), flush=True)


def _op_stats(logdir: str) -> list[dict]:
    """Per-op rows (type, operation, total_self_time, ...) of the profiler trace
    in `logdir`, host side. Needs the `xprof` package (not a runtime dependency)."""
    from xprof.convert import raw_to_tool_data

    paths = glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)
    data, _ = raw_to_tool_data.xspace_to_tool_data(paths, "framework_op_stats", {})
    table = json.loads(data)[0]  # the host table
    columns = [c["id"] for c in table["cols"]]
    return [dict(zip(columns, [cell.get("v") for cell in row["c"]])) for row in table["rows"]]


def _profile(translator, counted, counter, source_length: int = 32):
    import tensorflow as tf

    if SOURCES.value:
        batches = _real_batches(translator)
        spread = max(1, len(batches) // PROFILE_BATCHES.value)
        sources = batches[::spread][:PROFILE_BATCHES.value]
        what = f"sources={SOURCES.value} batches={len(sources)} of {BATCH.value}"
    else:
        sources = [_source(translator, BATCH.value, source_length)]
        what = f"batch={BATCH.value} source_length={source_length}"
    search = _search_fn(translator)
    _seconds(search, sources)  # traces outside the profile
    logdir = tempfile.mkdtemp(prefix="profile_decode_")
    tf.profiler.experimental.start(logdir)
    seconds = _seconds(search, sources)
    tf.profiler.experimental.stop()
    num_steps, _ = counter.count(counted, sources)
    print(f"profile beam=4 {what} steps={num_steps} "
          f"ms_per_step={1000 * seconds / max(num_steps, 1):.2f} (under the profiler)")
    rows = _op_stats(logdir)
    for key, title in (("type", "by op type"), ("operation", "by op")):
        totals = collections.Counter()
        for row in rows:
            name = row.get(key, "?")
            if key == "operation":  # the loop body's op, summed over parallel searches
                name = f'{name.rsplit("/while/", 1)[-1]} ({row.get("type", "?")})'
            totals[name] += float(row.get("total_self_time", 0) or 0)  # microseconds
        total = sum(totals.values())
        print(f"{title} (share of {total / 1000:.0f} ms self time; IDLE: executor threads waiting)")
        for name, value in totals.most_common(20):
            ms_per_step = value / 1000 / max(num_steps, 1)
            print(f"  {name[:70]:70s} {value / total:6.1%} {ms_per_step:7.2f} ms/step")


def main(argv):
    del argv
    if PROFILE.value and JIT.value:
        raise app.UsageError("--profile times the graph-mode search: leave out --jit_compile")
    process_defaults.apply()  # before TensorFlow's import: the binaries' kernels
    if PROFILE.value:
        _profile(*_translator(4))
        return
    print(f"decode weights={MODEL_DIR.value or 'random:' + PRESET.value} dtype={DTYPE.value} "
          f"jit_compile={JIT.value} cpus={os.cpu_count()} extra_length={EXTRA.value} "
          f"repeats={REPEATS.value}")
    translators = {k: _translator(k) for k in (4, 1)}
    for beam in (4, 1) if "throughput" in PARTS.value else ():
        for batch in (32, 1):
            source = _source(translators[beam][0], batch, 32)
            _print("throughput", _measure(*translators[beam], [source], batch), beam=beam,
                   batch=batch, source_length=32)
    if SOURCES.value:
        batches = _real_batches(translators[4][0])
        sentences = sum(int(b.shape[0]) for b in batches)
        for beam in (4, 1):
            _print("real", _measure(*translators[beam], batches, sentences), beam=beam,
                   batch=BATCH.value)


if __name__ == "__main__":
    app.run(main)
