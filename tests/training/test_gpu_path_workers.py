"""Two workers on localhost (TF_CONFIG), dropout on, started twice for every check:

  A: 6 steps, one per call, a checkpoint at 3 and 6, dev loss and dev BLEU every 3
     steps (split over the workers);
  B: a copy of A taken back to its step-3 checkpoint (as if killed after it), whose input
     positions hold the batches staged for step 4, resumed to step 6 at 4 steps per call
     (steps 4-6 in one call).

B equals A (N steps per call and the saved staged batches change nothing, across
workers), both stop on the same step, and A's evaluations are one device's, logged alike
by both workers with every step's all-reduced loss. (That a stop decided from an
evaluation, early stop, reaches both workers: it rides the budget flag, whose path
test_multi_worker.py's time budget proves.)
"""

import os
import shutil

import numpy as np
import pytest
import tensorflow as tf
from train_binary_fixtures import start_workers

from tf_transformer.cli import evaluation
from tf_transformer import model_dir as model_dir_lib
from tf_transformer.model_dir import ModelDir
from tf_transformer.inputs import corpus, pipeline
from tf_transformer.training.evaluators import dev_loss_fn

pytestmark = pytest.mark.slow

# float32 whatever the CPU (--dtype=auto would train bfloat16 on AMX): the logged dev loss is
# compared with a float32 evaluation of the checkpoint.
COMMON = ["--deterministic", "--dropout=0.3", "--log_every=3", "--checkpoint_minutes=100",
          "--dtype=float32"]
DEV_BLEU_SENTENCES = 4
DEV_PAIRS = 17


def _finish(processes, timeout=600):
    outputs = []
    try:
        for p in processes:
            outputs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in processes:
            p.kill()
    for p, out in zip(processes, outputs):
        assert p.returncode == 0, out[-3000:]
    return outputs


def _done_step(outputs):
    steps = {next(l for l in out.splitlines() if l.startswith("done ")).split()[1]
             for out in outputs}
    assert len(steps) == 1, steps  # the same on both workers
    return int(steps.pop().split("=")[1])


@pytest.fixture(scope="module")
def dev_tsv(tmp_path_factory, train_tsv):
    """The first 17 pairs of train_tsv (uneven halves for the two workers): each
    evaluation's dev loss reads a batch or two instead of 300 pairs."""
    with open(train_tsv, encoding="utf-8") as f:
        lines = [next(f) for _ in range(DEV_PAIRS)]
    path = tmp_path_factory.mktemp("dev") / "dev.tsv"
    path.write_text("".join(lines), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, train_tsv, dev_tsv, spm_model_path):
    a_dir = tmp_path_factory.mktemp("one_per_call")
    model_a, processes = start_workers(
        a_dir, train_tsv, spm_model_path, *COMMON, "--max_steps=6", "--eval_every=3",
        "--checkpoint_steps=3", f"--dev_data={dev_tsv}",
        f"--dev_bleu_sentences={DEV_BLEU_SENTENCES}")
    outputs_a = _finish(processes)
    b_dir = tmp_path_factory.mktemp("n_per_call")
    model_b = str(b_dir / "run")
    shutil.copytree(model_a, model_b, ignore=shutil.ignore_patterns("train", "best"))
    for directory in [model_b] + [os.path.join(model_b, "input", f"worker_{i}")
                                  for i in range(2)]:
        _back_to_step_3(directory)
    _, processes = start_workers(b_dir, train_tsv, spm_model_path, *COMMON,
                                 "--steps_per_call=4", "--max_steps=6")
    outputs_b = _finish(processes)
    return model_a, outputs_a, model_b, outputs_b


def _back_to_step_3(directory):
    """Makes the step-3 checkpoint of `directory` the latest, the step-6 one gone."""
    latest = tf.train.latest_checkpoint(directory)
    assert latest.endswith("-6"), latest
    for name in os.listdir(directory):
        if name.startswith(os.path.basename(latest) + "."):
            os.remove(os.path.join(directory, name))
    with open(os.path.join(directory, "checkpoint"), "w") as f:
        step_3 = latest[:-1] + "3"
        f.write(f'model_checkpoint_path: "{os.path.basename(step_3)}"\n'
                f'all_model_checkpoint_paths: "{os.path.basename(step_3)}"\n')
    if "input" in directory:  # the batches of step 4, already on the devices at step 3
        staged = tf.train.load_checkpoint(step_3).get_tensor("staged/.ATTRIBUTES/VARIABLE_VALUE")
        assert len(staged) == 3  # one replica per worker: source, target_in, target_out


def _weights(model_dir):
    """Every variable of the latest checkpoint: the weights, Adam's moments and step."""
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(model_dir))
    names = sorted(n for n in reader.get_variable_to_shape_map()
                   if n.endswith("VARIABLE_VALUE") and not n.startswith("save_counter"))
    return {n: reader.get_tensor(n) for n in names}


def test_n_steps_per_call_and_resume_equal_one_per_call_on_two_workers(runs):
    model_a, outputs_a, model_b, outputs_b = runs
    assert "with 2 replicas" in outputs_a[0]
    assert _done_step(outputs_a) == 6 == _done_step(outputs_b)
    assert all("restored the input position of step 3" in out for out in outputs_b)
    a, c = _weights(model_a), _weights(model_b)
    assert a.keys() == c.keys() and len(a) > 100
    for name in a:
        np.testing.assert_allclose(c[name], a[name], atol=2e-5, err_msg=name)


def test_evaluations_split_over_workers_are_one_devices(runs, dev_tsv, small_tokenizer):
    model_a, outputs_a, _, _ = runs
    evals = [[l for l in out.splitlines() if l.startswith("eval step=")] for out in outputs_a]
    assert evals[0] == evals[1] and [e.split()[1] for e in evals[0]] == ["step=3", "step=6"]
    losses = [[l.split()[:2] for l in out.splitlines() if l.startswith("step=")]
              for out in outputs_a]
    assert losses[0] == losses[1] and [l[0] for l in losses[0]] == ["step=3", "step=6"]
    assert os.path.exists(os.path.join(model_a, "best", "best.json"))
    assert not [d for d in os.listdir(model_a) if d.startswith(".worker_")]
    logged = dict(field.split("=") for field in evals[0][-1].split()[2:])
    loaded = model_dir_lib.load_model(ModelDir(model_a))  # ckpt-6, one device
    config = loaded.config
    dev = corpus.read_corpus(dev_tsv)
    dev_loss = dev_loss_fn(pipeline.make_dataset(dev, small_tokenizer, config.data,
                                                 training=False),
                           config.train.label_smoothing)(loaded.model)["dev_loss"]
    # One search per batch: the workers' 2 sentences each are below the parallel searches'
    # split, so they ran this search too; its graph holds one copy of the loop, not three
    # (3.4 s of tracing instead of 7.1, measured).
    one_search = config.replace(decode=config.decode.with_overrides({"parallel_searches": 1}))
    dev_bleu = evaluation.dev_bleu_fn(dev, small_tokenizer, one_search,
                                      DEV_BLEU_SENTENCES)(loaded.model)["dev_bleu"]
    assert float(logged["dev_loss"]) == pytest.approx(dev_loss, abs=1e-4)
    assert float(logged["dev_bleu"]) == pytest.approx(dev_bleu, abs=1e-4)
