"""selection.py: best/ by dev score, its record across restarts, early stopping, and
loading the best (or the mean of the best N) through model_dir_lib.load_model.

The fixture saves five checkpoints of known random weights with a rolling
manager that keeps only the newest, handing each to ModelSelection with a
scripted dev BLEU; so best/ must hold real copies, and every loaded or
averaged weight can be compared with numpy.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from binary_fixtures import run_main
from model_dir_fixtures import assert_weights, mean_weights
from model_fixtures import REPO_ROOT, tiny_config
from trainer_fixtures import STEPS, concat_batches, dataset_of, read_scalars, train_config

from tf_transformer.model import build_model
from tf_transformer import model_dir as model_dir_lib
from tf_transformer.model_dir import ModelDir
from tf_transformer.training.selection import ModelSelection
from tf_transformer.training.trainer import Trainer

BLEU = {10: 5.0, 20: 9.0, 30: 7.0, 40: 8.0, 50: 3.0}  # best two: 20, then 40


@pytest.fixture(scope="module")
def run(tmp_path_factory, small_tokenizer, spm_model_path):
    """(model_dir, {step: weights}, log lines) after five evaluations, keep_best=2."""
    path = str(tmp_path_factory.mktemp("selection") / "model")
    config = tiny_config(small_tokenizer.vocab_size, num_layers=1)
    with open(spm_model_path, "rb") as f:
        ModelDir(path).prepare(config, f.read())
    model = build_model(config.model)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), path, max_to_keep=1)
    lines, weights = [], {}
    chosen = ModelSelection(ModelDir(path), keep_best=2, early_stop=2, log_fn=lines.append)
    rng = np.random.default_rng(0)
    for step, bleu in BLEU.items():
        weights[step] = [rng.normal(size=v.shape).astype(np.float32) for v in model.weights]
        for var, value in zip(model.weights, weights[step]):
            var.assign(value)
        saved = manager.save(checkpoint_number=step)
        chosen.update(step, {"dev_loss": 10.0 - bleu, "dev_bleu": bleu}, saved)
        if step == 40:
            stopped_at_40 = chosen.stop_requested
    return path, weights, lines, stopped_at_40


def test_best_dir_keeps_copies_of_the_n_best_and_a_record(run):
    path, _, _, _ = run
    best = os.path.join(path, model_dir_lib.BEST_DIR)
    assert ModelDir(path).checkpoint_paths() == [os.path.join(path, "ckpt-50")]  # rolled away
    assert sorted({f.split(".")[0] for f in os.listdir(best) if f.startswith("ckpt-")}) == \
        ["ckpt-20", "ckpt-40"]
    with open(os.path.join(best, model_dir_lib.RECORD_FILE)) as f:
        record = json.load(f)
    assert record["metric"] == "dev_bleu"
    assert [(e["step"], e["dev_bleu"], e["checkpoint"]) for e in record["best"]] == [
        (20, 9.0, "ckpt-20"), (40, 8.0, "ckpt-40")]
    assert [(e["step"], e["dev_bleu"], e["dev_loss"]) for e in record["evaluations"]] == [
        (s, b, 10.0 - b) for s, b in BLEU.items()]
    assert tf.train.latest_checkpoint(best) == os.path.join(best, "ckpt-20")  # TF's view: best


def test_early_stop_after_n_evaluations_without_improvement(run):
    _, _, lines, stopped_at_40 = run
    assert stopped_at_40  # 30 and 40 did not beat 20
    assert [l for l in lines if l.startswith("best ")] == ["best step=10 dev_bleu=5.0000",
                                                           "best step=20 dev_bleu=9.0000"]
    assert "early stop: dev_bleu has not improved for 2 evaluations (best 9.0000 at step 20)" \
        in lines


def test_a_restarted_run_reads_the_record(run):
    path, _, _, _ = run
    resumed = ModelSelection(ModelDir(path), keep_best=2, early_stop=5, start_step=50)
    assert (resumed.best_score, resumed.since_best, resumed.metric) == (9.0, 3, "dev_bleu")
    assert not resumed.stop_requested
    resumed.chief = False  # a worker that only counts: no write
    resumed.update(60, {"dev_bleu": 1.0}, os.path.join(path, "ckpt-50"))
    resumed.update(70, {"dev_bleu": 1.0}, None)
    assert resumed.stop_requested and resumed.since_best == 5
    assert [e["step"] for e in ModelDir(path).read_record()["evaluations"]] == list(BLEU)
    # Restored from an older checkpoint: the later evaluations are forgotten.
    older = ModelSelection(ModelDir(path), keep_best=2, start_step=30)
    assert [e["step"] for e in older.evaluations] == [10, 20, 30]
    assert [e["step"] for e in older.best] == [20]
    with pytest.raises(ValueError, match="selects by dev_bleu"):
        older.update(40, {"dev_loss": 1.0}, None)


def test_load_model_best_and_the_mean_of_the_best_n(run):
    path, weights, _, _ = run
    assert_weights(model_dir_lib.load_model(ModelDir(path), "best").model, weights[20])
    loaded = model_dir_lib.load_model(ModelDir(path), "best", average_last=2)
    assert [os.path.basename(p) for p in loaded.paths] == ["ckpt-20", "ckpt-40"]
    assert_weights(loaded.model, mean_weights(weights, [20, 40]))
    assert ModelDir(path).resolve("best") == os.path.join(path, "best", "ckpt-20")
    with pytest.raises(ValueError, match="fewer than 3"):
        model_dir_lib.load_model(ModelDir(path), "best", average_last=3)
    with pytest.raises(ValueError, match="not both"):
        model_dir_lib.load_model(ModelDir(path), os.path.join(path, "ckpt-50"), average_last=2)


def test_best_without_a_record_is_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="fewer than 1"):
        ModelDir(str(tmp_path)).resolve("best")


def test_dev_loss_selects_when_there_is_no_bleu(tmp_path):
    chosen = ModelSelection(ModelDir(str(tmp_path)), keep_best=0, early_stop=1)
    assert chosen.update(1, {"dev_loss": 3.0}, None)
    assert chosen.update(2, {"dev_loss": 2.5}, None)  # lower loss: better
    assert not chosen.update(3, {"dev_loss": 2.6}, None) and chosen.stop_requested
    assert ModelDir(str(tmp_path)).read_record()["best"] == []  # keep_best=0: no copies


@pytest.mark.slow
def test_average_checkpoints_binary_averages_the_best(run, tmp_path):
    path, weights, _, _ = run
    output = str(tmp_path / "averaged")
    # In this process (binary_fixtures.run_main): a launch would import TensorFlow.
    result = run_main("tf_transformer.average_checkpoints",
                      [f"--model_dir={path}", "--num_best=2", f"--output={output}"])
    assert result["code"] == 0, result["stderr"][-3000:]
    assert f"averaged best 2 checkpoints of {path}" in result["stdout"]
    averaged = model_dir_lib.load_model(ModelDir(output))
    assert averaged.paths[0].endswith("averaged-40")
    assert_weights(averaged.model, mean_weights(weights, [20, 40]))


class Scripted:
    """An evaluate_fn returning the next dev BLEU of a script."""

    def __init__(self, scores):
        self.scores, self.calls = list(scores), 0

    def __call__(self, model):
        self.calls += 1
        return {"dev_bleu": self.scores[self.calls - 1], "dev_loss": 1.0 / self.calls}


def _train(model_dir, scores, max_steps, lines, **train):
    trainer = Trainer(train_config(**train), model_dir, tf.distribute.OneDeviceStrategy("/cpu:0"))
    evaluate = Scripted(scores)
    result = trainer.train(dataset_of([concat_batches(*pair) for pair in STEPS]),
                           max_steps=max_steps, evaluate_fn=evaluate, log_fn=lines.append)
    return result, evaluate


def test_trainer_keeps_the_best_and_stops_early(tmp_path):
    lines = []
    model_dir = str(tmp_path / "run")
    result, evaluate = _train(model_dir, [1.0, 3.0, 2.0, 2.5, 9.0, 9.0], 100, lines,
                              checkpoint_steps=1, keep_best=2, early_stop=2)
    # Evaluated at 1..4; step 4 was the second without improvement, so step 5 carried the
    # stop in its all-reduce; the final checkpoint (5) is evaluated once more.
    assert (result.stopped_by, result.step, evaluate.calls) == ("early_stop", 5, 5)
    assert any(l.startswith("early stop: dev_bleu has not improved for 2 ") for l in lines)
    record = ModelDir(model_dir).read_record()
    assert [e["step"] for e in record["best"]] == [5, 2]
    assert [e["step"] for e in record["evaluations"]] == [1, 2, 3, 4, 5]
    scalars = read_scalars(os.path.join(model_dir, "train"))
    assert scalars["dev_bleu"] == {1: 1.0, 2: 3.0, 3: 2.0, 4: 2.5, 5: 9.0}
    assert set(scalars["dev_loss"]) == {1, 2, 3, 4, 5}
    assert ModelDir(model_dir).resolve("best") == os.path.join(model_dir, "best", "ckpt-5")


def test_eval_every_checkpoints_the_evaluated_steps_and_resume_keeps_the_record(tmp_path):
    """The second run is a second `train` of the same trainer (its traced step reused): each
    `train` restores the latest checkpoint and reads the record from model_dir, as a new
    trainer's would. early_stop=2 from the start: the first run's one evaluation without
    improvement (step 4) does not stop it."""
    model_dir, lines = str(tmp_path / "run"), []
    trainer = Trainer(train_config(keep_best=1, early_stop=2), model_dir,
                      tf.distribute.OneDeviceStrategy("/cpu:0"))
    data = dataset_of([concat_batches(*pair) for pair in STEPS])
    first = trainer.train(data, max_steps=4, evaluate_fn=Scripted([5.0, 1.0]), eval_every=2,
                          log_fn=lines.append)
    assert (first.stopped_by, first.step) == ("max_steps", 4)
    assert [os.path.basename(p) for p in ModelDir(model_dir).checkpoint_paths()] == [
        "ckpt-2", "ckpt-4"]  # step 2 was saved for its evaluation
    assert [e["checkpoint"] for e in ModelDir(model_dir).read_record()["best"]] == ["ckpt-2"]
    result = trainer.train(data, max_steps=100, evaluate_fn=Scripted([2.0, 3.0, 4.0]),
                           eval_every=2, log_fn=lines.append)
    # The record survived: step 6 is the second evaluation without beating step 2's 5.0.
    assert (result.stopped_by, result.step) == ("early_stop", 7)
    assert [e["step"] for e in ModelDir(model_dir).read_record()["best"]] == [2]


_FLAGS_SCRIPT = """
import sys
from absl import app, flags
from tf_transformer import flags as f
f.define_restore_flags()
for argv in (["--checkpoint=best", "--average_last=3"], ["--checkpoint=best"],
             ["--average_last=3"], ["--checkpoint=/x/ckpt-5", "--average_last=3"]):
    flags.FLAGS.unparse_flags()
    flags.FLAGS(["x", "--model_dir=m", *argv])
    try:
        f.check_restore_flags()
        print("ok")
    except app.UsageError as error:
        print("refused", error)
"""


def test_restore_flags_take_best_with_average_last_and_refuse_a_path_with_it():
    result = subprocess.run([sys.executable, "-c", _FLAGS_SCRIPT], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[:3] == ["ok", "ok", "ok"]
    assert lines[3].startswith("refused") and "--checkpoint=best --average_last=N" in lines[3]
