"""A soak of an exported SavedModel in a clean process: memory and latency under varied traffic.

  python -m bench.serving_soak --export=EXPORT_DIR/VERSION [--requests=1500] [--max_minutes=30]
                               [--threads=0] [--seed=0] [--record=SOAK.jsonl]

What an app that loads the export meets: this process imports tensorflow and
tensorflow_text only (never tf_transformer), with TensorFlow's default threading
(--threads=N: N intra-op threads). It loads the export, runs its warmup requests
(assets.extra/warmup_requests.json; an export without one: a request of each batch size
1, 2, 4, ..., 32), then --requests requests of 1-32 sentences of
1-60 words drawn from the embedded dev split's words, 1 line in 50 hostile (empty,
invalid UTF-8, 3000 characters, control characters, punctuation only), until the
requests or --max_minutes run out. Prints the RSS after loading, after the warmup and
every 250 requests (`rss_mb`), the growth after the warmup (`rss_end_over_warm`),
latency percentiles per batch-size group (`latency_ms`) and the errors. --record writes
each request's lines and translations, which `python -m bench.soak_check` compares with
the Translator's.
"""

import argparse
import json
import os
import random
import time

DEV = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data",
                   "libreoffice-help.en-de", "dev.tsv")
GROUPS = ((1, 1), (2, 4), (5, 8), (9, 16), (17, 32))
HOSTILE = ["", "\udcff\udcfe broken bytes", "a" * 3000, "tab\tbell\x07 nul\x00 end", "?!... ;;; !!"]


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def requests(rng: random.Random, words: list[str], count: int):
    """`count` batches of 1-32 lines of 1-60 words, 1 line in 50 hostile."""
    for _ in range(count):
        yield [rng.choice(HOSTILE) if rng.random() < 0.02 else
               " ".join(rng.choices(words, k=rng.randint(1, 60))) for _ in range(rng.randint(1, 32))]


def record_line(batch: list[str], out) -> str:
    """A --record line: a request and its translations (lone surrogates survive JSON)."""
    return json.dumps({"text": batch, "translation": [t.decode("utf-8", "surrogateescape") for t in out]}) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--export", required=True, help="An export's version directory.")
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--max_minutes", type=float, default=30.0)
    parser.add_argument("--threads", type=int, default=0, help="Intra-op threads (0: default).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--record", help="JSON lines: the export, then each request and its output.")
    args = parser.parse_args()
    import numpy as np
    import tensorflow as tf
    import tensorflow_text  # noqa: F401 (the SentencePiece ops)

    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    start = rss_mb()
    model = tf.saved_model.load(args.export)
    serve = model.signatures["serving_default"]
    loaded = rss_mb()
    with open(DEV, encoding="utf-8") as f:
        lines = [line.split("\t")[0] for line in f]
    words = [w for line in lines for w in line.split()]
    warmup, began = os.path.join(args.export, "assets.extra", "warmup_requests.json"), time.time()
    if os.path.exists(warmup):
        with open(warmup, encoding="utf-8") as f:
            for request in json.load(f):
                model.signatures[request["signature"]](text=tf.constant(request["text"]))
    else:
        for size in (1, 2, 4, 8, 16, 32):
            serve(text=tf.constant(lines[:size]))
    warm = rss_mb()
    print(f"serving_soak export={args.export} threads={args.threads or 'default'} "
          f"warmup={'export' if os.path.exists(warmup) else 'sizes'} warmup_s={time.time() - began:.1f} "
          f"rss_mb start={start:.0f} loaded={loaded:.0f} warm={warm:.0f}", flush=True)
    latencies = {group: [] for group in GROUPS}
    record = open(args.record, "w", encoding="utf-8") if args.record else None
    if record:
        record.write(json.dumps({"export": os.path.abspath(args.export)}) + "\n")
    errors, deadline, n = 0, time.time() + 60 * args.max_minutes, 0
    for n, batch in enumerate(requests(random.Random(args.seed), words, args.requests), start=1):
        text = tf.constant([line.encode("utf-8", "surrogateescape") for line in batch])
        began = time.perf_counter()
        try:
            out = serve(text=text)["translation"].numpy()
            errors += len(out) != len(batch)
            if record:
                record.write(record_line(batch, out))
        except tf.errors.OpError as error:
            errors += 1
            print(f"error request={n}: {str(error)[:200]}", flush=True)
        group = next(g for g in GROUPS if g[0] <= len(batch) <= g[1])
        latencies[group].append(1000 * (time.perf_counter() - began))
        if n % 250 == 0:
            print(f"rss_mb requests={n} rss={rss_mb():.0f}", flush=True)
        if time.time() > deadline:
            break
    if record:
        record.close()
    end = rss_mb()
    print(f"rss_mb end={end:.0f} requests={n} errors={errors} "
          f"rss_end_over_warm={end / warm:.3f} rss_end_over_loaded={end / loaded:.3f}")
    for (low, high), times in latencies.items():
        if times:
            p50, p99 = np.percentile(times, [50, 99])
            print(f"latency_ms batch={low}-{high} requests={len(times)} p50={p50:.1f} "
                  f"p99={p99:.1f} p99_over_p50={p99 / p50:.2f}")


if __name__ == "__main__":
    main()
