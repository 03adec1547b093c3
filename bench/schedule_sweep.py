"""A schedule sweep on the dev split: which warmup, learning-rate scale and norm
position give the best model for a CPU budget.

  python -m bench.schedule_sweep --minutes=25 --settings=bench/sweeps/small_cpu.txt \
      [--corpus_dir=../shared/corpora/libreoffice-help.en-de] [--variant=reverse]

Each setting (one line of the settings file: `name  --flag=value ...`) trains
`tf_transformer.train` for --minutes on the corpus's train split, then scores its
final model (the trainer's averaged checkpoint) with `tf_transformer.evaluate` on the
first --dev_sentences pairs of the **dev** split: the test split is never read.
Variants check a winner's robustness on the same corpus: `reverse` (DE->EN),
`half` (the first half of the training pairs), `vocab4k` and `vocab16k`.
Prints one `sweep ...` line per setting and a Markdown table at the end; every
run's logs stay in --work_dir.

  python -m bench.schedule_sweep --system=opennmt --settings=bench/sweeps/opennmt_small_cpu.txt

runs the same sweep for OpenNMT-tf (the side-by-side peer, bench/compare/; its venv from
setup_peers.sh): each setting's `--warmup_steps=`, `--learning_rate_scale=` (the Noam
scale) and `--pre_norm` change the protocol's configuration (trainings.train_opennmt),
on the protocol's pieces and vocabulary; its own `onmt-main infer` translates the same
dev pairs, scored the same way. That side lives in the harness
(bench/compare/opennmt_sweep.py), which this module imports one way.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

from bench.compare.settings import read_settings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = ("none", "reverse", "half", "vocab4k", "vocab16k")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--settings", required=True, help="File: one `name --flag=value ...` a line.")
    parser.add_argument("--minutes", type=float, default=25.0)
    parser.add_argument("--corpus_dir",
                        default=os.path.join(REPO, "..", "shared", "corpora", "libreoffice-help.en-de"))
    parser.add_argument("--system", choices=("tf_transformer", "opennmt"),
                        default="tf_transformer")
    parser.add_argument("--variant", choices=VARIANTS, default="none")
    parser.add_argument("--dev_sentences", type=int, default=500)
    parser.add_argument("--only", default="", help="Comma list of setting names to run.")
    parser.add_argument("--work_dir", default=os.path.join(REPO, "bench", "out", "sweep"))
    return parser.parse_args(argv)


def variant_data(corpus_dir: str, variant: str, work_dir: str) -> tuple[str, str, list[str]]:
    """(train TSV, dev TSV, extra trainer flags) for a variant of the corpus."""
    train, dev = (os.path.join(corpus_dir, f"{s}.tsv") for s in ("train", "dev"))
    if variant in ("vocab4k", "vocab16k"):
        return train, dev, [f"--vocab_size={4000 if variant == 'vocab4k' else 16000}"]
    if variant == "none":
        return train, dev, []
    out = os.path.join(work_dir, f"data_{variant}")
    os.makedirs(out, exist_ok=True)
    paths = []
    for split, source in (("train", train), ("dev", dev)):
        with open(source, encoding="utf-8") as f:
            lines = f.readlines()
        if variant == "half" and split == "train":
            lines = lines[:len(lines) // 2]
        if variant == "reverse":
            lines = ["\t".join(reversed(l.rstrip("\n").split("\t", 1))) + "\n" for l in lines]
        paths.append(os.path.join(out, f"{split}.tsv"))
        with open(paths[-1], "w", encoding="utf-8") as f:
            f.writelines(lines)
    return paths[0], paths[1], []


def run(command: list[str], log_path: str) -> str:
    """Runs a binary of this package; its output is kept in log_path and returned."""
    print("$ " + " ".join(command), flush=True)
    result = subprocess.run([sys.executable, "-m"] + command, cwd=REPO, capture_output=True,
                            text=True, errors="replace")
    with open(log_path, "w", encoding="utf-8") as f:
        f.write(result.stdout + result.stderr)
    if result.returncode:
        print(f"  exit status {result.returncode}; see {log_path}", flush=True)
    return result.stdout + result.stderr


def sweep_one(name, flags, args, train, dev, extra) -> dict:
    model_dir = os.path.join(args.work_dir, f"{args.variant}_{name}")
    start = time.time()
    log = run(["tf_transformer.train", f"--model_dir={model_dir}", f"--train_data={train}",
               f"--dev_data={dev}", f"--max_minutes={args.minutes}", *extra, *flags],
              os.path.join(args.work_dir, f"{args.variant}_{name}_train.log"))
    steps = re.findall(r"^(?:done )?step=(\d+) loss=([\d.naif]+)", log, re.M)
    target_lang = "en" if args.variant == "reverse" else "de"
    scored = run(["tf_transformer.evaluate", f"--model_dir={model_dir}", f"--data={dev}",
                  f"--max_sentences={args.dev_sentences}", f"--target_lang={target_lang}",
                  "--noprogress"], os.path.join(args.work_dir, f"{args.variant}_{name}_dev.log"))
    bleu = re.search(r"^bleu=([\d.]+) chrf=([\d.]+)", scored, re.M)
    return {"name": name, "flags": " ".join(flags), "steps": int(steps[-1][0]) if steps else 0,
            "loss": steps[-1][1] if steps else "-", "minutes": (time.time() - start) / 60,
            "dev_bleu": float(bleu.group(1)) if bleu else float("nan"),
            "dev_chrf": float(bleu.group(2)) if bleu else float("nan"),
            "diverged": "warning: diverged?" in log}


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.work_dir, exist_ok=True)
    if args.system == "opennmt" and args.variant != "none":
        raise SystemExit("--system=opennmt sweeps the protocol's corpus only (--variant=none)")
    train, dev, extra = variant_data(args.corpus_dir, args.variant, args.work_dir)
    if args.system == "opennmt":
        from bench.compare import opennmt_sweep
        data = opennmt_sweep.sweep_data(args)
    else:
        data = None
    only = set(filter(None, args.only.split(",")))
    rows = []
    for name, flags in read_settings(args.settings):
        if only and name not in only:
            continue
        if data is not None:
            row = opennmt_sweep.sweep_one(name, flags, args, data)
        else:
            row = sweep_one(name, flags, args, train, dev, extra)
        rows.append(row)
        print("sweep variant={variant} name={name} steps={steps} loss={loss} dev_bleu={dev_bleu:.2f} "
              "dev_chrf={dev_chrf:.2f} diverged={diverged} minutes={minutes:.1f}".format(
                  variant=args.variant, **row), flush=True)
    print(f"\n| setting ({args.variant}, {args.minutes:g} min) | flags | steps | last loss | "
          f"dev BLEU | dev chrF |\n| --- | --- | --- | --- | --- | --- |")
    for row in sorted(rows, key=lambda r: -r["dev_bleu"]):
        print("| {name} | `{flags}` | {steps} | {loss} | {dev_bleu:.2f} | {dev_chrf:.2f} |".format(**row))


if __name__ == "__main__":
    main()
