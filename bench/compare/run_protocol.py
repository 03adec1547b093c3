"""The small-cpu protocol, side by side: tf_transformer against OpenNMT-tf and CTranslate2.

  python bench/compare/run_protocol.py [--minutes=25] [--test_sentences=0] [--work_dir=...]

Prints one line per figure with both values and their ratio, and writes
WORK_DIR/figures.json and the learning curves; bench/compare/README.md says how.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from bench.compare import decode_benchmark, dev_curves, precisions  # noqa: E402
from bench.compare.report import ours_keys, plot, report, system_of, training_keys  # noqa: E402
from bench.compare.scoring import opennmt_bleu, ours_bleu, write_pieces  # noqa: E402
from bench.compare.trainings import (CORPUS_DIR, ONMT_VENV, REPO, earlier_trainings,  # noqa: E402
                                     matmul_peak_process, recipe_model, run_logged, train_both)

VOCAB_SIZE = 8000  # SentencePiece pieces, both systems' one vocabulary


def parse_args():
    """The protocol's options; bench/compare/README.md says what each does."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=25.0, help="Training budget per system.")
    parser.add_argument("--test_sentences", type=int, default=0, help="Test subset (0: all).")
    parser.add_argument("--latency_sentences", type=int, default=200)
    parser.add_argument("--corpus_dir", default=CORPUS_DIR)
    parser.add_argument("--work_dir", default=os.path.join(REPO, "bench", "out", "compare"))
    parser.add_argument("--plot", default="", help="Default: WORK_DIR/learning_curves.png.")
    parser.add_argument("--skip", default="",
                        help="Comma list of: opennmt,ours,ctranslate2,decode. A system skipped in "
                             "training keeps its entry of an earlier WORK_DIR/training.json.")
    parser.add_argument("--reuse_training", action="store_true",
                        help="Reuse WORK_DIR/training.json and the model dirs of an earlier run.")
    parser.add_argument("--ours_dtype", default="auto", choices=("auto",) + precisions.OURS_DTYPES,
                        help="The report's `ours`; auto: mixed_bfloat16 with amx_bf16.")
    parser.add_argument("--ours_dtypes", default="",
                        help="Comma list of our dtypes to train, one after the other.")
    parser.add_argument("--ours_export_dtypes", default="auto",
                        help="Comma list of float32,bfloat16; auto: both with amx_bf16.")
    parser.add_argument("--concurrent", action="store_true",
                        help="Train both systems at once, each pinned to its own CPU core.")
    parser.add_argument("--dev_curve_sentences", type=int, default=300,
                        help="Dev BLEU of every kept checkpoint on this many dev pairs (0: none).")
    return parser.parse_args()


def prepare_data(corpus_dir, work, test_sentences=0):
    """Vocabulary, pieces files, OpenNMT-tf vocabulary; returns paths and length stats."""
    import sentencepiece as spm

    from tf_transformer.inputs import corpus, tokenizer

    data = os.path.join(work, "data")
    os.makedirs(data, exist_ok=True)
    vocab = os.path.join(data, "vocab.model")
    pairs = {s: corpus.read_tsv(f"{corpus_dir}/{s}.tsv") for s in ("train", "dev", "test")}
    if not os.path.exists(vocab):
        tokenizer.train_sentencepiece(pairs["train"], VOCAB_SIZE, vocab)
    sp = spm.SentencePieceProcessor(model_file=vocab)
    for split, p in pairs.items():
        for side, texts in (("en", p.sources), ("de", p.targets)):
            if not os.path.exists(os.path.join(data, f"{split}.{side}.sp")):
                write_pieces(os.path.join(data, f"{split}.{side}.sp"), sp, texts)
    # OpenNMT-tf's vocabulary from the SentencePiece one (onmt-build-vocab maps
    # <unk>, <s>, </s> to its own special tokens).
    sp_vocab = os.path.join(data, "vocab.sp.vocab")
    with open(sp_vocab, "w", encoding="utf-8") as f:
        f.writelines(f"{sp.id_to_piece(i)}\t{sp.get_score(i)}\n" for i in range(sp.get_piece_size()))
    onmt_vocab = os.path.join(data, "vocab.onmt")
    if not os.path.exists(onmt_vocab) and os.path.exists(ONMT_VENV):
        subprocess.run([os.path.join(ONMT_VENV, "onmt-build-vocab"), "--from_vocab", sp_vocab,
                        "--from_format", "sentencepiece", "--save_vocab", onmt_vocab], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    train, test, n = pairs["train"], pairs["test"], test_sentences or None  # 0: all
    return {"data": data, "vocab": vocab, "onmt_vocab": onmt_vocab, "sp": sp,
            "dev_sources": pairs["dev"].sources, "dev_targets": pairs["dev"].targets,
            "mean_source": statistics.mean(len(sp.encode(t)) for t in train.sources),
            "mean_target": statistics.mean(len(sp.encode(t)) for t in train.targets),
            "test_sources": test.sources[:n], "test_targets": test.targets[:n]}


def test_bleu(args, work, d, results):
    """Each system's own decoder on the test subset: its sacreBLEU."""
    refs, skip = d["test_targets"], args.skip.split(",")
    if "opennmt" not in skip:
        sources = write_pieces(os.path.join(work, "test_subset.en.sp"), d["sp"], d["test_sources"])
        start = time.time()
        onmt = results["opennmt"]
        onmt["test_bleu"] = opennmt_bleu(
            lambda command: run_logged(command, os.path.join(work, "opennmt_infer.log")),
            onmt["base_args"], sources, os.path.join(work, "opennmt_test.pred.sp"), d["sp"], refs)
        onmt["test_decode_seconds"] = time.time() - start
    for key in ours_keys(results) if "ours" not in skip else ():  # each of our trainings
        start = time.time()
        results[key]["test_bleu"] = ours_bleu(
            lambda command: run_logged(command, os.path.join(work, f"{key}_test.log")),
            results[key]["model_dir"], os.path.join(args.corpus_dir, "test.tsv"),
            [f"--max_sentences={len(refs)}"], os.path.join(work, f"{key}_test.hyp"), refs)
        results[key]["test_decode_seconds"] = time.time() - start


def main():
    args = parse_args()
    work = os.path.abspath(args.work_dir)
    os.makedirs(work, exist_ok=True)
    args.plot = args.plot or os.path.join(work, "learning_curves.png")
    skip = args.skip.split(",")
    cpu = precisions.read_cpuinfo()
    ours_trainings = precisions.ours_trainings(args.ours_dtype, args.ours_dtypes, cpu)
    args.export_dtypes = precisions.export_dtypes(args.ours_export_dtypes, cpu)
    d = prepare_data(args.corpus_dir, work, args.test_sentences)
    from tf_transformer.model import flops

    peak = matmul_peak_process(one_core=args.concurrent)
    model = recipe_model(VOCAB_SIZE)
    s, t = d["mean_source"], d["mean_target"]
    # One FLOP count for both systems: a training step over mean-length pairs
    # (EOS on both sides, BOS-shifted target), per counted token.
    flops_per_pair = flops.train_step_flops(model, 1, round(s + 1), round(t + 1))
    results = {"minutes": args.minutes, "matmul_peak_flops": peak, "cpu": cpu,
               "mean_pieces": {"source": s, "target": t}, "decode": {},
               # Multiply each system's own token count by this for the common count.
               "common_tokens": {"ours": (s + t + 1) / (s + t + 2), "opennmt": 1.0}}
    print(f"matmul_peak_float32={peak / 1e9:.1f} GFLOP/s{' (one core)' if args.concurrent else ''} "
          f"mean_pieces source={s:.1f} target={t:.1f}")
    print(precisions.cpu_line(cpu) + " ours_trainings=" + ",".join(f"{k}:{v}" for k, v in ours_trainings)
          + " ours_exports=" + ",".join(args.export_dtypes), flush=True)
    training_json = os.path.join(work, "training.json")
    if args.reuse_training:  # the training run's figures, its matmul peak included
        with open(training_json) as f:
            earlier = json.load(f)
        results.update({k: earlier[k] for k in training_keys(earlier) + ["matmul_peak_flops"]
                        if k in earlier})
        peak = results["matmul_peak_flops"]
    else:
        results.update(earlier_trainings(training_json, skip))
        results.update(train_both(args, work, d, ours=ours_trainings))
        for name in training_keys(results):
            if system_of(name) not in skip and results.get(name):
                results[name].update(matmul_peak_flops=peak, cpu=cpu["model"])
        if args.dev_curve_sentences:
            dev_curves.add_dev_curves(args, work, d, results)
    for name in training_keys(results):
        r = results.get(name)
        if r and r["tokens_per_sec"]:
            common = r["tokens_per_sec"] * results["common_tokens"][system_of(name)]
            r["mfu"] = common / (s + t + 1) * flops_per_pair / r.get("matmul_peak_flops", peak)
    test_bleu(args, work, d, results)
    if not args.reuse_training:  # the trainings, their curves and test BLEU
        with open(training_json, "w") as f:
            json.dump({k: results[k] for k in training_keys(results) + ["matmul_peak_flops"]
                       if k in results}, f)
    if "decode" not in skip:
        decode_benchmark.decode_all(args, work, d, results)
    plot(results, args.plot)
    report(results)
    with open(os.path.join(work, "figures.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)
    print(f"figures: {os.path.join(work, 'figures.json')} curves: {args.plot}")


if __name__ == "__main__":
    main()
