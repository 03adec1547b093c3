"""The training binary end to end: progress lines, SIGTERM, kill -9, refusals.

Each test runs `python -m tf_transformer.train` on a few hundred embedded pairs with a
1+1-layer d_model 32 model: in a subprocess where the process is the point (kill -9,
SIGTERM), in this process otherwise (binary_fixtures.run_main).
"""

import json
import os
import signal

import pytest
import tensorflow as tf
from binary_fixtures import run_main
from train_binary_fixtures import (
    start_train,
    train_command,
    wait_for_step,
)
from trainer_fixtures import read_scalars

pytestmark = pytest.mark.slow


def _train_here(train_tsv, spm_model_path, model_dir, *extra):
    """train_command's run in this process (binary_fixtures.run_main)."""
    _, _, module, *argv = train_command(train_tsv, spm_model_path, model_dir, *extra)
    return run_main(module, argv)


def test_kill_9_then_sigterm_checkpoint_then_resume_with_progress_lines(
        tmp_path, train_tsv, spm_model_path):
    """One model_dir, three runs: kill -9 loses at most one checkpoint interval; the resumed
    run goes on from the restored step until SIGTERM, which checkpoints and exits cleanly;
    the next run resumes from that checkpoint, and TensorBoard holds both resumed runs."""
    model_dir = str(tmp_path / "run")
    train_dir = os.path.join(model_dir, "train")
    killed = start_train(train_command(train_tsv, spm_model_path, model_dir,
                                       "--max_steps=100000", "--checkpoint_steps=2"))
    killed_after = wait_for_step(killed, 5)
    killed.kill()
    killed.wait()
    restored = int(tf.train.latest_checkpoint(model_dir).rsplit("-", 1)[1])
    assert killed_after - 2 <= restored <= killed_after + 1
    # The killed run's event file may end in a half-written record: not read below.
    killed_events = set(os.listdir(train_dir)) if os.path.isdir(train_dir) else set()

    process = start_train(train_command(train_tsv, spm_model_path, model_dir,
                                        "--max_steps=100000"))
    seen = []
    signalled_after = wait_for_step(process, restored + 3, seen=seen)
    process.send_signal(signal.SIGTERM)
    output = process.communicate(timeout=120)[0]
    assert process.returncode == 0, output
    assert "stopped_by=signal" in output
    first = next(l for l in seen if l.startswith("step="))
    assert first.startswith(f"step={restored + 1} ")  # resumed where the checkpoint was
    stopped = int(tf.train.latest_checkpoint(model_dir).rsplit("-", 1)[1])
    assert stopped >= signalled_after

    # The last run in this process: what it shows is its output, not its process.
    resumed = _train_here(train_tsv, spm_model_path, model_dir, f"--max_steps={stopped + 2}")
    assert resumed["code"] == 0, resumed["stderr"][-3000:]
    lines = [l for l in resumed["stdout"].splitlines() if l.startswith("step=")]
    assert lines[0].startswith(f"step={stopped + 1} ")
    for key in ("step=", "loss=", "lr=", "tokens_per_sec=", "ms_per_step="):
        assert key in lines[0] and key in first
    assert tf.train.latest_checkpoint(model_dir).endswith(f"ckpt-{stopped + 2}")
    scalars = read_scalars(train_dir, skip=killed_events)  # TensorBoard, both resumed runs
    assert set(scalars["loss"]) >= {restored + 1, restored + 2, restored + 3, stopped + 1,
                                    stopped + 2}
    resumed_loss = float(lines[0].split("loss=")[1].split()[0])
    assert abs(scalars["loss"][stopped + 1] - resumed_loss) < 1e-5


@pytest.fixture(scope="module")
def dev_tsv(tmp_path_factory, train_tsv):
    """8 pairs of train_tsv with short sources: each evaluation's dev loss reads one batch
    and its beam search (to source length + extra_length) is short."""
    with open(train_tsv, encoding="utf-8") as f:
        short = [line for line in f if len(line.split("\t")[0].split()) <= 3][:8]
    path = tmp_path_factory.mktemp("dev") / "dev.tsv"
    path.write_text("".join(short), encoding="utf-8")
    return str(path)


def test_dev_bleu_best_dir_early_stop_translate_the_best_then_another_preset_is_refused(
        tmp_path, train_tsv, dev_tsv, spm_model_path):
    """Dev evaluation at every checkpoint, best/, early stop and translate --checkpoint=best;
    then a run of another architecture in the same model_dir is refused."""
    model_dir = str(tmp_path / "run")
    result = _train_here(train_tsv, spm_model_path, model_dir, "--max_steps=100",
                         f"--dev_data={dev_tsv}", "--dev_bleu_sentences=3",
                         "--checkpoint_steps=1", "--keep_best=2", "--early_stop=1",
                         "--divergence_steps=50")
    assert result["code"] == 0, result["stderr"][-3000:]
    lines = result["stdout"].splitlines()
    assert lines[0].startswith("training dtype=")  # --dtype=auto resolved, said first
    assert "requested=auto" in lines[0]
    assert lines[1].startswith("unigram_loss=")
    evaluations = [l for l in lines if l.startswith("eval step=")]
    assert len(evaluations) >= 2 and evaluations[0].startswith("eval step=1 ")
    assert "dev_loss=" in evaluations[0] and "dev_bleu=" in evaluations[0]
    assert any(l.startswith("early stop: dev_bleu has not improved for 1 ") for l in lines)
    done = lines[-1]
    assert "stopped_by=early_stop" in done and " best=best/ckpt-" in done, done
    with open(os.path.join(model_dir, "best", "best.json")) as f:
        record = json.load(f)
    assert 1 <= len(record["best"]) <= 2
    assert len(record["evaluations"]) == len(evaluations)
    scalars = read_scalars(os.path.join(model_dir, "train"))
    assert set(scalars["dev_bleu"]) == set(scalars["dev_loss"]) == {
        e["step"] for e in record["evaluations"]}
    assert "unigram_loss" in scalars and "divergence_warnings" in scalars
    average = ["--checkpoint=best", f"--average_last={len(record['best'])}"]
    translated = run_main("tf_transformer.translate", [
        f"--model_dir={model_dir}", "--beam_size=1", "--extra_length=3", *average],
        stdin=b"Fonts\n")
    assert translated["code"] == 0, translated["stderr"][-3000:]
    assert len(translated["stdout"].splitlines()) == 1
    assert os.path.join(model_dir, "best", record["best"][0]["checkpoint"]) in translated["stderr"]
    other = _train_here(train_tsv, spm_model_path, model_dir, "--max_steps=2", "--d_model=64")
    assert other["code"] != 0
    assert "different architecture" in other["stderr"]


# --max_length=16: packed rows of 16 tokens are one static shape, so the step compiles
# once (each new shape would be one XLA compilation, the most of this test's time).
# --static_batch's shapes through the trainer: test_trainer_compiled.py.
def test_static_shape_runs_train_through_the_binary(tmp_path, train_tsv, spm_model_path):
    shape_flags = ["--packing", "--compile_step", "--max_length=16"]
    model_dir = str(tmp_path / "run")
    result = _train_here(train_tsv, spm_model_path, model_dir, "--max_steps=4", *shape_flags)
    assert result["code"] == 0, result["stderr"][-3000:]
    losses = [float(l.split("loss=")[1].split()[0]) for l in result["stdout"].splitlines()
              if l.startswith("step=")]
    assert len(losses) == 4 and all(0 < loss < 20 for loss in losses)
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    assert config["data"]["packing"] and not config["data"]["static_batch"]
    assert config["train"]["compile_step"]
