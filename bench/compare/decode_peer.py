"""Decoding throughput and latency of one system, in its own venv (run_protocol.py calls it).

  python decode_peer.py --system=S --model=PATH --sources=FILE --output=FILE.json

Systems: tf_transformer (our SavedModel's serving_default on raw sentences), opennmt
(OpenNMT-tf's SavedModel on SentencePiece pieces), ctranslate2 (a model directory, on pieces;
--compute_type float32 or int8); bench/compare/README.md says what each one's timing holds.

Batches of --batch_size in order of source length (the same order for every
system; --sources is given sorted), then --latency_sentences one at a time.
Writes the translations (pieces joined by spaces, or text) and the figures.
"""

import argparse
import json
import os
import resource
import statistics
import time


def load_system(args):
    """`run(lines) -> translations` of args.system at args.model (args.threads:
    intra-op threads, 0 the default); bench.ab_exports loads ours the same way."""
    if args.system == "ctranslate2":
        import ctranslate2

        translator = ctranslate2.Translator(args.model, device="cpu", compute_type=args.compute_type,
                                            inter_threads=1, intra_threads=args.threads)

        def run(lines):
            batch = [line.split() for line in lines]
            results = translator.translate_batch(
                batch, beam_size=4, length_penalty=0.6, max_batch_size=0,
                max_decoding_length=max(len(b) for b in batch) + 1 + 50,
                suppress_sequences=[["<pad>"], ["<s>"]])
            return [" ".join(r.hypotheses[0]) for r in results]
        run.compute_type = translator.compute_type  # what it runs in, after any conversion
        return run

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    if args.system == "tf_transformer":
        import tensorflow_text  # noqa: F401  (registers the SentencePiece op)

        loaded = tf.saved_model.load(args.model)
        serve = loaded.signatures["serving_default"]

        def run(lines):
            out = serve(text=tf.constant(lines))
            return [t.decode("utf-8") for t in out["translation"].numpy()]
        with open(os.path.join(args.model, "assets", "export_metadata.json")) as f:
            decode = json.load(f)["decode"]
        run.length_bucket = decode.get("length_bucket")
        run.compute_type = decode.get("dtype", "float32")  # the export's weights and products
        run.tokenize = loaded.signatures.get("tokenize")  # absent from a --signatures export
        return run

    serve = tf.saved_model.load(args.model).signatures["serving_default"]

    def run(lines):
        tokens = [line.split() for line in lines]
        width = max(len(t) for t in tokens)
        out = serve(tokens=tf.constant([t + [""] * (width - len(t)) for t in tokens]),
                    length=tf.constant([len(t) for t in tokens], tf.int32))
        pieces, lengths = out["tokens"].numpy()[:, 0], out["length"].numpy()[:, 0]
        return [" ".join(p.decode("utf-8") for p in row[:n]) for row, n in zip(pieces, lengths)]
    return run


def _warm_up(run, batches) -> int:
    """Runs the first batch of each shape an XLA-compiled SavedModel compiles
    for (batch padded to a power of two, source to a multiple of its
    length_bucket, as translator.py pads): compilation is a one-time cost of a
    process, as a TF Serving warmup file pays it, and is reported apart.
    Returns the number of shapes. Other systems have nothing to compile."""
    bucket = getattr(run, "length_bucket", None)
    if not bucket:
        return 0
    import tensorflow as tf

    seen = set()
    for lines in batches:
        width = int(run.tokenize(text=tf.constant(lines))["source_ids"].shape[1])
        key = (1 << (len(lines) - 1).bit_length(), -(-width // bucket))
        if key not in seen:
            seen.add(key)
            run(lines)
    return len(seen)


def _timed(fn, *args) -> tuple:
    """(fn(*args), the wall seconds it took)."""
    start = time.perf_counter()
    return fn(*args), time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--system", required=True, choices=["tf_transformer", "opennmt", "ctranslate2"])
    parser.add_argument("--model", required=True)
    parser.add_argument("--sources", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--compute_type", default="float32")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--latency_sentences", type=int, default=200)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    with open(args.sources, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    batches = [lines[i:i + args.batch_size] for i in range(0, len(lines), args.batch_size)]
    latency_lines = lines[::max(1, len(lines) // max(args.latency_sentences, 1))][:args.latency_sentences]
    run, load_seconds = _timed(load_system, args)
    load_seconds += _timed(run, batches[0])[1]  # trace / warm up
    compiled_shapes, compile_seconds = _timed(_warm_up, run,
                                              batches + [[line] for line in latency_lines])
    translations, batch_seconds = _timed(lambda: [t for batch in batches for t in run(batch)])
    latencies = sorted(_timed(run, [line])[1] for line in latency_lines)
    figures = {
        "system": args.system, "compute_type": args.compute_type,
        "effective_compute_type": getattr(run, "compute_type", None), "sentences": len(lines),
        "batch_size": args.batch_size, "batch_seconds": batch_seconds,
        "sentences_per_sec": len(lines) / batch_seconds,
        "latency_p50_ms": 1000 * statistics.median(latencies) if latencies else None,
        "latency_p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
        if latencies else None,
        "load_and_warmup_seconds": load_seconds,
        "xla_compiled_shapes": compiled_shapes, "xla_warmup_seconds": compile_seconds,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "translations": translations,
    }
    with open(args.output, "w", encoding="utf-8") as f:
        json.dump(figures, f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
