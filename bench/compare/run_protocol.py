"""The small-cpu protocol, side by side: tf_transformer against OpenNMT-tf and CTranslate2.

  python bench/compare/run_protocol.py [--minutes=25] [--test_sentences=0] [--work_dir=...]

Runs in our .venv and drives the peers as subprocesses in their own venvs (setup_peers.sh),
one at a time (--concurrent: the two trainings at once, a core each): the vocabulary and
pieces files, the matmul peak, the trainings (trainings.py), the dev curves (dev_curves.py),
test BLEU, the exports' decoding (decode_benchmark.py), then one line per figure with both
values and their ratio (report.py), WORK_DIR/figures.json and the learning curves
(--plot). bench/compare/README.md says what each figure measures and how.
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
from bench.compare.scoring import opennmt_bleu, ours_bleu  # noqa: E402
from bench.compare.settings import (OPENNMT_SETTING, OPENNMT_SWEEP, opennmt_schedule,  # noqa: E402
                                    read_settings)
from bench.compare.trainings import (ONMT_VENV, REPO, earlier_trainings,  # noqa: E402
                                     matmul_peak_process, recipe_model, run_logged, train_both)

SPLITS = ("train", "dev", "test")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=25.0, help="Training budget per system.")
    parser.add_argument("--test_sentences", type=int, default=0, help="Test subset (0: all).")
    parser.add_argument("--latency_sentences", type=int, default=200)
    parser.add_argument("--corpus_dir",
                        default=os.path.join(REPO, "..", "shared", "corpora", "libreoffice-help.en-de"))
    parser.add_argument("--work_dir", default=os.path.join(REPO, "bench", "out", "compare"))
    parser.add_argument("--plot", default="",
                        help="Where the learning curves go (default: WORK_DIR/learning_curves.png).")
    parser.add_argument("--vocab_size", type=int, default=8000)
    parser.add_argument("--skip", default="", help="Comma list of: opennmt,ours,ctranslate2,decode (decode: training "
                             "and test BLEU only, no export or decoding benchmark). A system skipped "
                             "in training keeps its entry of an earlier WORK_DIR/training.json, so "
                             "the two trainings of a long budget can run as two invocations.")
    parser.add_argument("--reuse_training", action="store_true",
                        help="Skip training: reuse WORK_DIR/training.json and the model dirs of an "
                             "earlier run (to re-measure decoding after a change).")
    parser.add_argument("--ours_flags", default="",
                        help="Extra flags for our trainer, space separated (e.g. --jit_compile).")
    parser.add_argument("--ours_dtype", default="auto", choices=("auto",) + precisions.OURS_DTYPES,
                        help="Our trainer's --dtype for the protocol's run (the report's `ours`): "
                             "auto is mixed_bfloat16 on a CPU with AMX bfloat16 (amx_bf16 in "
                             "/proc/cpuinfo), else float32.")
    parser.add_argument("--ours_dtypes", default="",
                        help="Comma list of our dtypes to train, one after the other, each into its "
                             "own model dir (float32: ours/, mixed_bfloat16: ours_bf16/), e.g. "
                             "float32,mixed_bfloat16; --ours_dtype's is added if missing. The others "
                             "are reported as ours_DTYPE against OpenNMT-tf, with every dtype's test "
                             "BLEU (default: --ours_dtype's only).")
    parser.add_argument("--ours_export_dtypes", default="auto",
                        help="Comma list of float32,bfloat16: the dtypes our checkpoint is exported "
                             "and decoded in (python -m export --dtype); auto: both on a CPU with "
                             "AMX bfloat16, else float32.")
    parser.add_argument("--opennmt_precision", default="auto", choices=("auto",) + precisions.OPENNMT_PRECISIONS,
                        help="OpenNMT-tf's training precision: float32, or mixed (--mixed_precision, "
                             "mixed_float16, forced on the CPU); auto: the faster of the probe.")
    parser.add_argument("--opennmt_probe_minutes", type=float, default=2.0,
                        help="With --opennmt_precision=auto: train OpenNMT-tf this long in each "
                             "precision before its timed training and keep the faster by tokens/s "
                             "(0: no probe, float32).")
    parser.add_argument("--opennmt_setting", default=OPENNMT_SETTING,
                        help="OpenNMT-tf's schedule: a setting name of " + OPENNMT_SWEEP + ", the "
                             "best on dev of its sweep (bench/schedule_sweep.py; BUILD.md).")
    parser.add_argument("--concurrent", action="store_true",
                        help="Train both systems at once, each pinned to its own CPU core (a longer budget "
                             "for both in one run: same machine, same minutes, one core each); the "
                             "matmul peak is then measured on one core.")
    parser.add_argument("--dev_curve_sentences", type=int, default=300,
                        help="Dev BLEU of every kept checkpoint on this many dev pairs, after "
                             "training (dev_curves.py; 0: no dev-BLEU curves).")
    return parser.parse_args()


# -- data --------------------------------------------------------------------
def prepare_data(args, work):
    """Vocabulary, pieces files, OpenNMT-tf vocabulary; returns paths and length stats."""
    import sentencepiece as spm

    from tf_transformer.inputs import corpus, tokenizer

    data = os.path.join(work, "data")
    os.makedirs(data, exist_ok=True)
    vocab = os.path.join(data, "vocab.model")
    pairs = {s: corpus.read_tsv(os.path.join(args.corpus_dir, f"{s}.tsv")) for s in SPLITS}
    if not os.path.exists(vocab):
        tokenizer.train_sentencepiece(pairs["train"], args.vocab_size, vocab)
    sp = spm.SentencePieceProcessor(model_file=vocab)
    for split, p in pairs.items():
        for side, texts in (("en", p.sources), ("de", p.targets)):
            path = os.path.join(data, f"{split}.{side}.sp")
            if not os.path.exists(path):
                with open(path, "w", encoding="utf-8") as f:
                    f.writelines(" ".join(sp.encode(t, out_type=str)) + "\n" for t in texts)
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
    src = [len(sp.encode(t)) for t in pairs["train"].sources]
    tgt = [len(sp.encode(t)) for t in pairs["train"].targets]
    test = pairs["test"]
    n = args.test_sentences or len(test.sources)
    return {"data": data, "vocab": vocab, "onmt_vocab": onmt_vocab, "sp": sp,
            "dev_sources": pairs["dev"].sources, "dev_targets": pairs["dev"].targets,
            "mean_source": statistics.mean(src), "mean_target": statistics.mean(tgt),
            "test_sources": test.sources[:n], "test_targets": test.targets[:n]}


# -- decoding ----------------------------------------------------------------
def test_bleu(args, work, d, results):
    """Each system's own decoder on the test subset: its sacreBLEU."""
    refs, skip = d["test_targets"], args.skip.split(",")
    if "opennmt" not in skip:
        sources = os.path.join(work, "test_subset.en.sp")
        with open(os.path.join(d["data"], "test.en.sp"), encoding="utf-8") as f:
            lines = f.readlines()[:len(refs)]
        with open(sources, "w", encoding="utf-8") as f:
            f.writelines(lines)
        start = time.time()
        onmt = results["opennmt"]
        onmt["test_bleu"] = opennmt_bleu(
            lambda command: run_logged(command, os.path.join(work, "opennmt_infer.log"), env=onmt.get("env")),
            os.path.join(ONMT_VENV, "onmt-main"), onmt["base_args"], sources,
            os.path.join(work, "opennmt_test.pred.sp"), d["sp"], refs)
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
    d = prepare_data(args, work)
    from tf_transformer.model import flops

    peak = matmul_peak_process(one_core=args.concurrent)
    model = recipe_model(args.vocab_size)
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
        flags = dict(read_settings(OPENNMT_SWEEP))[args.opennmt_setting]
        results.update(train_both(args, work, d, opennmt_schedule(flags), ours=ours_trainings))
        if "opennmt" not in skip:
            results["opennmt"]["setting"] = args.opennmt_setting
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
        json.dump({k: v for k, v in results.items()}, f, indent=1, default=str)
    print(f"figures: {os.path.join(work, 'figures.json')} curves: {args.plot}")


if __name__ == "__main__":
    main()
