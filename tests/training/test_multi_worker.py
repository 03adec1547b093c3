"""Two workers on localhost agree on stopping and checkpointing: no one waits alone.

Each test starts two `python -m tf_transformer.train --strategy=multi_worker`
processes with TF_CONFIG and bounds every wait, so a hang fails instead of
blocking the suite.
"""

import os
import signal

import pytest
import tensorflow as tf
from train_binary_fixtures import start_workers, wait_for_step

pytestmark = pytest.mark.slow


def _workers(tmp_path, train_tsv, vocab, *extra):
    return start_workers(tmp_path, train_tsv, vocab, "--max_steps=100000", *extra)


def _finish(processes, timeout=240):
    outputs = []
    for p in processes:
        try:
            outputs.append(p.communicate(timeout=timeout)[0])
        except Exception:
            for q in processes:
                q.kill()
            raise
    for p, out in zip(processes, outputs):
        assert p.returncode == 0, out[-3000:]
    done = [next(l for l in out.splitlines() if l.startswith("done step=")) for out in outputs]
    steps = [int(d.split()[1].split("=")[1]) for d in done]
    assert steps[0] == steps[1]  # the same step on both
    return steps[0], done, outputs


def test_time_budget_ends_both_workers_with_one_checkpoint(tmp_path, train_tsv):
    # No vocabulary yet: the chief trains it into model_dir, the other worker waits.
    vocab = str(tmp_path / "run" / "vocab.model")
    model_dir, processes = _workers(tmp_path, train_tsv, vocab, "--max_minutes=0.05",
                                    "--vocab_size=400")
    step, done, outputs = _finish(processes)
    assert "training a 400-piece vocabulary" in outputs[0]
    # The other worker never trains one: it waits for the chief's file, or (when it starts
    # after the chief has written it, as under a loaded machine) finds it there.
    assert "-piece vocabulary" not in outputs[1]
    assert all("stopped_by=max_minutes" in d for d in done)
    assert tf.train.latest_checkpoint(model_dir).endswith(f"ckpt-{step}")
    assert not [d for d in os.listdir(model_dir) if d.startswith(".worker_")]


def test_sigterm_to_one_worker_stops_both_with_a_checkpoint(tmp_path, train_tsv, spm_model_path):
    model_dir, processes = _workers(tmp_path, train_tsv, spm_model_path)
    wait_for_step(processes[1], 2)
    processes[1].send_signal(signal.SIGTERM)  # the non-chief: the chief must still save
    step, done, _ = _finish(processes)
    assert all("stopped_by=signal" in d for d in done)
    assert step >= 2
    assert tf.train.latest_checkpoint(model_dir).endswith(f"ckpt-{step}")
