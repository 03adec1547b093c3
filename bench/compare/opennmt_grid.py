"""OpenNMT-tf's best recipe on a corpus, not its paper-matched one: a grid of its documented
options, each trained to convergence, the grid's best picked on dev, its test BLEU scored once.

  python -m bench.compare.opennmt_grid [--corpus_dir=DIR] [--work_dir=W] [--only=NAME,...]
                                       [--score_test]

Each setting is the protocol's model (opennmt_model.py: 3+3 layers, d_model 256, pre-norm,
warmup 1600) and batch (opennmt_small_cpu.yml) with its own dropouts and label smoothing,
trained in W/NAME with OpenNMT-tf's evaluation every EVAL_STEPS steps on the first
DEV_PAIRS dev pairs (its BLEU scorer, on pieces), early stopping after EARLY_STOP
evaluations without a gain, then its average of the last AVERAGE_LAST checkpoints
(W/NAME/avg). Rerunning continues an unfinished setting from its last checkpoint (OpenNMT-tf
reloads its evaluation history) and skips a finished one (W/NAME/done.json). Prints
`grid NAME: dev_bleu=D` (sacreBLEU of the averaged model on those dev pairs, detokenized),
then `grid best: NAME`; with --score_test, `test_bleu NAME=T` for that one, once.
"""

import argparse
import json
import os

from bench.compare.run_protocol import prepare_data
from bench.compare.scoring import opennmt_bleu, write_pieces
from bench.compare.trainings import CORPUS_DIR, HERE, ONMT_MAIN, REPO, opennmt_args, run_logged

GRID = {  # name -> (dropout, attention_dropout, ffn_dropout, label_smoothing)
    "d01_ls01": (0.1, 0.1, 0.1, 0.1),
    "d03_ls01": (0.3, 0.1, 0.1, 0.1),
    "d03_ls02": (0.3, 0.1, 0.1, 0.2),
}
DEV_PAIRS, EVAL_STEPS, EARLY_STOP, AVERAGE_LAST = 500, 300, 8, 5
MODEL_FILE = """import sys
sys.path.insert(0, {here!r})
from opennmt_model import model as protocol_model


def model():
    return protocol_model(dropout={0}, attention_dropout={1}, ffn_dropout={2})
"""


def onmt_args(d, setting_dir, setting) -> list[str]:
    """onmt-main's --model and --config of one setting (files written in `setting_dir`)."""
    os.makedirs(setting_dir, exist_ok=True)
    model_file = os.path.join(setting_dir, "model.py")
    with open(model_file, "w") as f:
        f.write(MODEL_FILE.format(*setting[:3], here=HERE))
    return opennmt_args(d, model_file, os.path.join(setting_dir, "run.yml"), {
        "model_dir": setting_dir,
        "train": {"keep_checkpoint_max": AVERAGE_LAST + EARLY_STOP, "save_checkpoints_steps": EVAL_STEPS,
                  "average_last_checkpoints": AVERAGE_LAST},
        "eval": {"steps": EVAL_STEPS, "scorers": "bleu",
                 "early_stopping": {"metric": "bleu", "min_improvement": 0.01, "steps": EARLY_STOP}}},
        params={"label_smoothing": setting[3]}, dev=(d["dev_en"], d["dev_de"]))


def run_setting(d, work, name) -> dict:
    """Trains (or continues) one setting to its early stop, then scores its average on dev."""
    setting_dir = os.path.join(work, name)
    done = os.path.join(setting_dir, "done.json")
    if os.path.exists(done):
        with open(done) as f:
            return json.load(f)
    args = onmt_args(d, setting_dir, GRID[name])
    _, _, rc = run_logged([ONMT_MAIN, "--log_level", "INFO", *args, "train", "--with_eval"],
                          os.path.join(work, f"{name}_train.log"))
    if rc:
        raise SystemExit(f"{name}: onmt-main train exited with {rc}")
    averaged = args + ["--checkpoint_path", os.path.join(setting_dir, "avg")]
    dev = opennmt_bleu(lambda command: run_logged(command, os.path.join(work, f"{name}_dev.log")),
                       averaged, d["dev_en"], os.path.join(setting_dir, "dev.pred.sp"), d["sp"],
                       d["dev_targets"][:DEV_PAIRS])
    result = {"name": name, "setting": GRID[name], "dev_bleu": dev, "onmt_args": averaged}
    with open(done, "w") as f:
        json.dump(result, f)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus_dir", default=CORPUS_DIR)
    parser.add_argument("--work_dir", default=os.path.join(REPO, "runs", "opennmt_grid"))
    parser.add_argument("--only", default=",".join(GRID), help="Comma list of GRID's names.")
    parser.add_argument("--score_test", action="store_true",
                        help="Score the test split with the best setting on dev (once).")
    args = parser.parse_args()
    work = os.path.abspath(args.work_dir)
    d = prepare_data(args.corpus_dir, work)
    d["dev_en"], d["dev_de"] = (write_pieces(os.path.join(d["data"], f"dev{DEV_PAIRS}.{side}.sp"), d["sp"],
                                             texts[:DEV_PAIRS])
                                for side, texts in (("en", d["dev_sources"]), ("de", d["dev_targets"])))
    results = [run_setting(d, work, name) for name in args.only.split(",")]
    for r in results:
        print(f"grid {r['name']}: dev_bleu={r['dev_bleu']:.2f}", flush=True)
    best = max(results, key=lambda r: r["dev_bleu"])
    print(f"grid best: {best['name']}", flush=True)
    scored = os.path.join(work, "test_bleu.json")
    if args.score_test and not os.path.exists(scored):
        test = opennmt_bleu(lambda command: run_logged(command, os.path.join(work, "test.log")),
                            best["onmt_args"], os.path.join(d["data"], "test.en.sp"),
                            os.path.join(work, "test.pred.sp"), d["sp"], d["test_targets"])
        with open(scored, "w") as f:
            json.dump({"name": best["name"], "test_bleu": test}, f)
    if os.path.exists(scored):
        with open(scored) as f:
            record = json.load(f)
        print(f"test_bleu {record['name']}={record['test_bleu']:.2f}", flush=True)


if __name__ == "__main__":
    main()
