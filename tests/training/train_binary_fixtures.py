"""Shared by the training-binary tests (test_train_binary.py, test_multi_worker.py): the
command line of a tiny run, its environment, and processes read or started by them.
The 300-pair `train_tsv` fixture is in tests/training/conftest.py."""

import json
import os
import socket
import subprocess
import sys
import time

from model_fixtures import REPO_ROOT

# --shuffle_buffer=100: the input position saved with each checkpoint holds the shuffle
# buffer; at the preset's 20000 a save wrote 5.6 MB in 1.3 s, at 100 0.4 MB in 0.13 s.
# --divergence_steps=0: no unigram loss of the corpus before training (0.7 s of CPU in each
# run; the dev-BLEU test, which checks its line and scalars, turns it on again).
MODEL_FLAGS = ["--preset=tiny", "--num_layers=1", "--d_model=32", "--d_ff=64", "--num_heads=2",
               "--tokens_per_batch=512", "--max_length=64", "--warmup_steps=50",
               "--checkpoint_minutes=100", "--log_every=1", "--shuffle_buffer=100",
               "--divergence_steps=0"]


def train_command(train_tsv, spm_model_path, model_dir, *extra):
    return [sys.executable, "-m", "tf_transformer.train", f"--train_data={train_tsv}",
            f"--vocab={spm_model_path}", f"--model_dir={model_dir}", *MODEL_FLAGS, *extra]


def train_env(**extra):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", **extra)
    env.pop("TF_CONFIG", None)
    return {**env, **extra}


def start_train(command, env=None):
    return subprocess.Popen(command, cwd=REPO_ROOT, env=env or train_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for_step(process, step, deadline=240, seen=None):
    """Reads progress lines until `step=<n>` with n >= step; returns n. The lines read are
    appended to `seen` when given."""
    end = time.time() + deadline
    for line in process.stdout:
        if seen is not None:
            seen.append(line)
        if line.startswith("step="):
            n = int(line.split()[0].split("=")[1])
            if n >= step:
                return n
        assert time.time() < end, "no progress"
    raise AssertionError(f"process ended (rc={process.wait()}) before step {step}")


def _free_ports(n):
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def start_workers(tmp_path, train_tsv, vocab, *extra):
    """Two `--strategy=multi_worker` training processes on localhost: (model_dir, processes)."""
    ports = _free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    model_dir = str(tmp_path / "run")
    processes = []
    for task in range(2):
        env = train_env(TF_CONFIG=json.dumps({"cluster": cluster,
                                              "task": {"type": "worker", "index": task}}))
        processes.append(start_train(train_command(train_tsv, vocab, model_dir,
                                                   "--strategy=multi_worker", *extra), env))
    return model_dir, processes
