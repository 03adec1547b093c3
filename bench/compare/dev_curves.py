"""Dev BLEU against training minutes: after training, every checkpoint a system kept,
translated by its own decoder on the first --dev_curve_sentences dev pairs, at the minute
its trainer logged saving it (bench/compare/README.md, "How each figure is measured")."""

import os
import re
import subprocess

from bench.compare.report import training_keys
from bench.compare.scoring import opennmt_bleu, ours_bleu, write_pieces


def checkpoint_seconds(lines) -> dict:
    """(seconds, line) pairs of a training log -> {checkpoint file name: seconds}."""
    return {os.path.basename(match.group(1)): seconds for seconds, line in lines
            if (match := re.search(r"[Ss]aved checkpoint (\S+)", line))}


def curve(checkpoints, seconds, score) -> list:
    """[(seconds, score(checkpoint))] for the checkpoints whose saving was logged, in time
    order (a checkpoint saved outside the logged run has no minute, and is left out)."""
    timed = sorted((seconds[os.path.basename(c)], c) for c in checkpoints
                   if os.path.basename(c) in seconds)
    return [(t, score(c)) for t, c in timed]


def add_dev_curves(args, work, d, results) -> None:
    """Adds `curve_dev_bleu` [(seconds, BLEU)] to each training's results (each of ours too)
    (run_protocol's `results`, `d` its prepare_data)."""
    from bench.compare import trainings
    from bench.compare.train_logs import read_logged
    from tf_transformer.model_dir import ModelDir  # both systems' checkpoints are TensorFlow's

    count = args.dev_curve_sentences
    sources, references = d["dev_sources"][:count], d["dev_targets"][:count]
    dev_tsv = os.path.join(work, "dev_curve.tsv")
    with open(dev_tsv, "w", encoding="utf-8") as f:
        f.writelines(f"{s}\t{t}\n" for s, t in zip(sources, references))
    pieces = write_pieces(os.path.join(work, "dev_curve.en.sp"), d["sp"], sources)

    def run(command):
        subprocess.run(command, cwd=trainings.REPO, check=True, capture_output=True)

    def score_ours(checkpoint, key):
        return ours_bleu(run, results[key]["model_dir"], dev_tsv,
                         [f"--checkpoint={checkpoint}", "--noprogress"],
                         os.path.join(work, f"dev_curve_{key}.hyp"), references)

    def score_opennmt(checkpoint, key):
        return opennmt_bleu(run, results["opennmt"]["base_args"] + ["--checkpoint_path", checkpoint],
                            pieces, os.path.join(work, "dev_curve_opennmt.pred.sp"), d["sp"], references)

    for name in training_keys(results):  # ours, ours_DTYPE..., opennmt
        score = score_opennmt if name == "opennmt" else score_ours
        r = results.get(name)
        if not r or "train_log" not in r or "curve_dev_bleu" in r:  # kept from an earlier run
            continue
        seconds = checkpoint_seconds(read_logged(r["train_log"]))
        r["curve_dev_bleu"] = curve(ModelDir(r["model_dir"]).checkpoint_paths(), seconds,
                                    lambda checkpoint: score(checkpoint, name))
        print(f"dev_bleu_curve {name} (minutes, BLEU on {len(references)} dev pairs): "
              + " ".join(f"{t / 60:.1f}:{b:.2f}" for t, b in r["curve_dev_bleu"]), flush=True)
