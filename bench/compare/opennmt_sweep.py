"""OpenNMT-tf's side of the dev-split schedule sweep (`python -m bench.schedule_sweep
--system=opennmt --settings=bench/sweeps/opennmt_small_cpu.txt`).

bench/schedule_sweep.py reads the settings and prints the rows; this trains and scores
one setting the harness's way: the protocol's training (trainings.train_opennmt, in the
OpenNMT-tf venv of setup_peers.sh) on the protocol's pieces and vocabulary
(run_protocol.prepare_data), with the setting's schedule (settings.opennmt_schedule),
then OpenNMT-tf's own `onmt-main infer` on the first --dev_sentences dev pairs, scored
with sacreBLEU as schedule_sweep scores ours.
"""

import argparse
import os
import time

from bench.compare import run_protocol, trainings
from bench.compare.settings import opennmt_schedule


def sweep_data(args) -> dict:
    """The protocol's pieces, vocabularies and dev references (run_protocol.prepare_data)."""
    from tf_transformer.inputs import corpus

    protocol = argparse.Namespace(corpus_dir=args.corpus_dir, vocab_size=8000, test_sentences=0)
    data = run_protocol.prepare_data(protocol, args.work_dir)
    data["dev_targets"] = corpus.read_tsv(os.path.join(args.corpus_dir, "dev.tsv")).targets
    return data


def sweep_one(name, flags, args, data) -> dict:
    """One OpenNMT-tf setting: the protocol's training with this schedule, then its own
    decoder on the first --dev_sentences dev pairs (beam 4, alpha 0.6), scored here."""
    import sacrebleu

    start = time.time()
    protocol = argparse.Namespace(minutes=args.minutes)
    result = trainings.train_opennmt(protocol, args.work_dir, data, name=name,
                                     schedule=opennmt_schedule(flags))
    with open(os.path.join(data["data"], "dev.en.sp"), encoding="utf-8") as f:
        sources = f.readlines()[:args.dev_sentences]
    features = os.path.join(args.work_dir, "dev_subset.en.sp")
    with open(features, "w", encoding="utf-8") as f:
        f.writelines(sources)
    predictions = os.path.join(args.work_dir, f"{name}_dev.pred.sp")
    trainings.run_logged([os.path.join(trainings.ONMT_VENV, "onmt-main")]
                         + result["base_args"] + ["infer", "--features_file", features,
                                                  "--predictions_file", predictions],
                         os.path.join(args.work_dir, f"{name}_dev.log"),
                         env=result["env"])
    with open(predictions, encoding="utf-8") as f:
        hypotheses = [data["sp"].decode(line.split()) for line in f]
    references = data["dev_targets"][:len(hypotheses)]
    curve = result["curve_train"]
    return {"name": name, "flags": " ".join(flags), "steps": result["last_step"],
            "loss": f"{curve[-1][1]:.2f}" if curve else "-",
            "minutes": (time.time() - start) / 60,
            "dev_bleu": sacrebleu.corpus_bleu(hypotheses, [references]).score,
            "dev_chrf": sacrebleu.corpus_chrf(hypotheses, [references]).score,
            "diverged": False}
