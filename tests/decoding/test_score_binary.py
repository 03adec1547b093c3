"""The score binary on a small TSV, as users run it: one row per valid pair, in input order,
equal to the in-process Translator.score; bad lines skipped, counted and logged. The TSV
run runs in this process (binary_fixtures.run_main); the refusals' exit codes in a
subprocess."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from binary_fixtures import run_main
from model_fixtures import REPO_ROOT, SAMPLE_LINES

from tf_transformer.config import DecodeConfig
from tf_transformer.decoding.translator import Translator
from tf_transformer.model_dir import ModelDir

GOOD = [(SAMPLE_LINES[0], "Immer Kontrollkästchen"), (SAMPLE_LINES[2], "Schriftarten"),
        (SAMPLE_LINES[4], "Ersetzungstabelle"), (SAMPLE_LINES[5], "Nur Bildschirm")]


def _run(*args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, "-m", "tf_transformer.score", *args], cwd=REPO_ROOT,
                          env=env, capture_output=True, timeout=600)


@pytest.mark.slow
def test_score_binary_writes_one_row_per_valid_pair(tmp_path, tiny_model_dir):
    data = tmp_path / "pairs.tsv"
    lines = [f"{s}\t{t}".encode() for s, t in GOOD]
    # Line 1 has no TAB, 3 an empty side, 5 invalid UTF-8, 6 is blank: skipped.
    data.write_bytes(b"\n".join([lines[0], b"no tab here", lines[1], b"\tleer", lines[2],
                                 b"bad \xff\tbytes", b"", lines[3]]) + b"\n")
    output = tmp_path / "scores.tsv"
    run = run_main("tf_transformer.score", [f"--model_dir={tiny_model_dir}", f"--data={data}",
                                            f"--output={output}", "--alpha=0.6",
                                            "--batch_size=3"])
    assert run["code"] == 0, run["stderr"][-3000:]
    rows = [line.split("\t") for line in output.read_text().split("\n")[:-1]]
    assert [row[0] for row in rows] == ["0", "2", "4", "7"]
    translator = Translator.from_model_dir(ModelDir(tiny_model_dir),
                                           decode_config=DecodeConfig(alpha=0.6))
    expected = translator.score(tf.constant([s for s, _ in GOOD]), tf.constant([t for _, t in GOOD]))
    got = np.array([[float(x) for x in row[1:]] for row in rows])
    np.testing.assert_array_equal(got[:, 1], expected["tokens"].numpy())
    for column, key in ((0, "log_prob"), (2, "log_prob_per_token"), (3, "score")):
        np.testing.assert_allclose(got[:, column], expected[key].numpy(), rtol=1e-5, atol=2e-6)
    stderr = run["stderr"]
    assert "score: 4 pairs" in stderr and "3 lines skipped" in stderr
    for reason in ("no_tab", "empty_side", "invalid_utf8"):
        assert reason in stderr


def test_score_binary_needs_data(tiny_model_dir):
    run = _run(f"--model_dir={tiny_model_dir}")
    assert run.returncode != 0 and b"--data is required" in run.stderr
    run = _run(f"--model_dir={tiny_model_dir}", "--data=x", "--beam_size=4")  # no search here
    assert run.returncode != 0 and b"Unknown command line flag" in run.stderr
