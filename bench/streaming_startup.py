"""Start-up cost of a large training corpus: seconds to the first batch and step, peak RSS.

  python -m bench.streaming_startup [--pairs=1000000,5000000] [--old_max_pairs=1000000]

Generates each corpus once under --work_dir (/tmp: never committed): --pairs
lines resampled from the embedded train split with each side's words shuffled,
so sentence lengths are realistic and lines are not repeated verbatim. Then,
for each size, a fresh process per path measures, from after the imports:
first_batch_s (the first per-replica batch out of distribute_datasets_from_function),
first_step_s and second_step_s (the tiny preset's training steps, tracing included),
peak_rss_at_first_batch_mb and peak_rss_mb (the process's maximum resident set then and
at the end, TensorFlow itself included; rss_after_imports_mb is TensorFlow and Keras alone).
Paths: `new` streams with streamed.open_corpus; `old` is the in-memory reader
plus the start-up tokenising pass that dataset_fn used to make
(stats.count_over_length), run only up to --old_max_pairs.
"""

import os
import random
import resource
import subprocess
import sys
import tempfile
import time

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EMBEDDED_TRAIN = os.path.join(REPO, "data", "libreoffice-help.en-de", "train.tsv")

PAIRS = flags.DEFINE_list("pairs", ["1000000", "5000000"], "corpus sizes, in pairs")
OLD_MAX_PAIRS = flags.DEFINE_integer("old_max_pairs", 1_000_000, "largest size for `old`")
PATHS = flags.DEFINE_list("paths", ["new", "old"], "which readers to time")
WORK_DIR = flags.DEFINE_string("work_dir", "/tmp/streaming_startup", "generated corpora")
STEPS = flags.DEFINE_bool("steps", True, "also time the tiny preset's first two steps")
CHILD = flags.DEFINE_string("child", None, "internal: measure one path on --data")
DATA = flags.DEFINE_string("data", None, "internal: the corpus of a --child run")
VOCAB = flags.DEFINE_string("vocab", None, "SentencePiece model; default: train one (untimed)")


def generate(path: str, pairs: int, seed: int = 1) -> None:
    """Writes `pairs` TSV lines, each an embedded pair with its words shuffled."""
    rng = random.Random(seed)
    with open(EMBEDDED_TRAIN, encoding="utf-8") as f:
        base = [line.rstrip("\n").split("\t") for line in f if "\t" in line]
    tmp = path + ".part"
    with open(tmp, "w", encoding="utf-8") as out:
        for _ in range(pairs):
            source, target = rng.choice(base)
            words = [source.split(), target.split()]
            for side in words:
                rng.shuffle(side)
            out.write(f"{' '.join(words[0])}\t{' '.join(words[1])}\n")
    os.replace(tmp, path)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(path: str, spec: str, vocab_path: str, steps: bool) -> str:
    """One path in this process: the figures line."""
    import tensorflow as tf

    from tf_transformer import presets
    from tf_transformer.inputs import corpus, pipeline, stats, streamed, tokenizer
    from tf_transformer.training.trainer import Trainer

    rss_imports = peak_rss_mb()
    start = time.perf_counter()
    vocab = tokenizer.Tokenizer(vocab_path)
    config = presets.get_preset("tiny", vocab.vocab_size)
    if path == "new":
        data = streamed.open_corpus(spec)
    else:
        data = corpus.read_corpus(spec)
        stats.count_over_length(data, vocab, config.data.max_length)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    iterator = iter(strategy.distribute_datasets_from_function(
        pipeline.dataset_fn(data, vocab, config.data, training=True)))
    next(iterator)
    figures = {"first_batch_s": time.perf_counter() - start,
               "peak_rss_at_first_batch_mb": peak_rss_mb()}
    if steps:
        step = Trainer(config, tempfile.mkdtemp(), strategy).step_fn()
        for name in ("first_step_s", "second_step_s"):
            float(step(iterator)["loss"])
            figures[name] = time.perf_counter() - start
    figures["peak_rss_mb"] = peak_rss_mb()
    figures["rss_after_imports_mb"] = rss_imports
    return " ".join(f"{k}={v:.1f}" for k, v in figures.items())


def main(argv):
    del argv
    if CHILD.value:
        print(f"streaming_startup path={CHILD.value} "
              + measure(CHILD.value, DATA.value, VOCAB.value, STEPS.value), flush=True)
        return
    os.makedirs(WORK_DIR.value, exist_ok=True)
    vocab = VOCAB.value or os.path.join(WORK_DIR.value, "spm8k.model")
    if not os.path.exists(vocab):
        from tf_transformer.inputs import corpus, tokenizer
        tokenizer.train_sentencepiece(corpus.read_tsv(EMBEDDED_TRAIN), 8000, vocab)
    for pairs in map(int, PAIRS.value):
        data = os.path.join(WORK_DIR.value, f"corpus_{pairs}.tsv")
        if not os.path.exists(data):
            began = time.perf_counter()
            generate(data, pairs)
            print(f"generated {data} in {time.perf_counter() - began:.0f} s", flush=True)
        for path in PATHS.value:
            if path == "old" and pairs > OLD_MAX_PAIRS.value:
                continue
            result = subprocess.run(
                [sys.executable, "-m", "bench.streaming_startup", f"--child={path}",
                 f"--data={data}", f"--vocab={vocab}", f"--steps={STEPS.value}"],
                cwd=REPO, capture_output=True, text=True, check=False)
            lines = [line for line in result.stdout.splitlines()
                     if line.startswith("streaming_startup")]
            print(f"{lines[-1]} pairs={pairs}" if lines else
                  f"streaming_startup path={path} pairs={pairs} failed:\n{result.stderr[-3000:]}",
                  flush=True)


if __name__ == "__main__":
    app.run(main)
