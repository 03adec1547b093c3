"""Latency and throughput of the exported SavedModel against the in-process Translator.

  python -m bench.serving_latency [--model_dir=DIR] [--requests=30] [--batches=4]

Without --model_dir: the `small` preset with random weights (seeded) and an 8000-piece
BPE vocabulary trained on the embedded train split; random weights almost never emit
EOS, so the figures are a worst case per sentence (source tokens + extra_length).

Both paths run the same graph (the export saves the Translator's functions):
  translator  Translator.translate, a tf.function in this process
  saved_model tf.saved_model.load(EXPORT_DIR/1).signatures["serving_default"]
Latency: batch 1, one dev sentence per request (--requests, cycling through
the dev split), p50 and p99 in ms. Throughput: --batches batches of 32 dev
sentences, sentences per second. Each path is warmed up (traced) first.
"""

import os
import random
import tempfile
import time

from absl import app, flags

from tf_transformer import presets, process_defaults
from tf_transformer.config import DecodeConfig

MODEL_DIR = flags.DEFINE_string("model_dir", None, "A trained model dir; default random `small`.")
REQUESTS = flags.DEFINE_integer("requests", 30, "Batch-1 requests for the latency figures.")
BATCHES = flags.DEFINE_integer("batches", 4, "Batches of 32 for the throughput figure.")
BEAM = flags.DEFINE_integer("beam_size", 4, "Beam size.")
EXTRA = flags.DEFINE_integer("extra_length", 50, "Max output = source + this.")
MAX_CHARS = flags.DEFINE_integer("max_chars", 200, "Dev sentences up to this many characters.")

DATA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data",
                        "libreoffice-help.en-de")


def _random_small_model_dir(path: str) -> str:
    import tensorflow as tf

    from tf_transformer.inputs import corpus, tokenizer
    from tf_transformer.model import build_model
    from tf_transformer.model_dir import ModelDir

    random.seed(1)  # Keras draws its default seeds from Python's random
    tf.keras.utils.set_random_seed(1)
    train = corpus.read_tsv(os.path.join(DATA_DIR, "train.tsv"))
    proto = tokenizer.train_sentencepiece(train, 8000)
    config = presets.get_preset("small", vocab_size=tokenizer.Tokenizer(proto).vocab_size)
    ModelDir(path).prepare(config, proto)
    model = build_model(config.model)
    tf.train.CheckpointManager(tf.train.Checkpoint(model=model), path, max_to_keep=1).save(0)
    return path


def _latency(fn, sentences):
    import numpy as np

    times = []
    for sentence in sentences:
        start = time.perf_counter()
        fn([sentence])["translation"].numpy()
        times.append(time.perf_counter() - start)
    return 1000 * np.percentile(times, 50), 1000 * np.percentile(times, 99)


def _throughput(fn, batches):
    start = time.perf_counter()
    for batch in batches:
        fn(batch)["translation"].numpy()
    return sum(map(len, batches)) / (time.perf_counter() - start)


def main(argv):
    del argv
    process_defaults.apply()  # before TensorFlow's import: the binaries' kernels
    import numpy as np
    import tensorflow as tf

    from tf_transformer.decoding.translator import Translator
    from tf_transformer.exporters import saved_model, warmup
    from tf_transformer.model_dir import ModelDir

    work = tempfile.mkdtemp(prefix="bench_serving_")
    model_dir = ModelDir(MODEL_DIR.value or _random_small_model_dir(os.path.join(work, "model")))
    weights = MODEL_DIR.value or ("random (seeded) small preset, 8000-piece BPE on the "
                                  "embedded train split")
    decode = DecodeConfig(beam_size=BEAM.value, extra_length=EXTRA.value, nbest=BEAM.value)
    translator = Translator.from_model_dir(model_dir, decode_config=decode)
    used = translator.checkpoint_paths
    start = time.perf_counter()
    path = saved_model.export(translator, os.path.join(work, "export"),
                             model_dir.shared_vocab_path,
                             {"checkpoints": used}, warmup_sentences=())
    export_seconds = time.perf_counter() - start
    serve = tf.saved_model.load(path).signatures["serving_default"]
    dev = [s for s in warmup.read_sentences(os.path.join(DATA_DIR, "dev.tsv"))
           if len(s) <= MAX_CHARS.value]
    requests = [dev[i % len(dev)] for i in range(REQUESTS.value)]
    batches = [dev[32 * i:32 * (i + 1)] for i in range(BATCHES.value)]
    tokens = translator.tokenizer.tokenize(tf.constant(requests)).row_lengths().numpy()
    print(f"serving_latency weights={weights} beam={BEAM.value} alpha={decode.alpha} "
          f"extra_length={EXTRA.value} cpus={os.cpu_count()} export_seconds={export_seconds:.1f} "
          f"requests={len(requests)} mean_source_tokens={tokens.mean():.1f} "
          f"onednn={os.environ.get('TF_ENABLE_ONEDNN_OPTS')}")
    paths = {"translator": lambda lines: translator.translate(tf.constant(lines)),
             "saved_model": lambda lines: serve(text=tf.constant(lines))}
    for name, fn in paths.items():
        fn(requests[:1])  # trace / warm up
        fn(batches[0][:2])
        p50, p99 = _latency(fn, requests)
        throughput = _throughput(fn, batches)
        print(f"{name:12s} batch1_p50_ms={p50:.0f} batch1_p99_ms={p99:.0f} "
              f"batch32_sentences_per_sec={throughput:.2f}", flush=True)
    same = all(np.array_equal(paths["translator"](b)["translation"].numpy(),
                              paths["saved_model"](b)["translation"].numpy())
               for b in batches[:1])
    print(f"identical_outputs_first_batch={same}")


if __name__ == "__main__":
    app.run(main)
