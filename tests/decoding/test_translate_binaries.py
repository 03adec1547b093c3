"""The translate and evaluate binaries, run as users run them (subprocesses), on the tiny model.

Expected outputs come from the library in this process with the same decoding
settings: `translate_sentences` over the whole input at once, the path the
translate binary took before it streamed.
"""

import os
import queue
import re
import subprocess
import sys
import threading
import time

import pytest
from model_fixtures import REPO_ROOT, SAMPLE_LINES
from sacrebleu.metrics import BLEU, CHRF

from tf_transformer.config import DecodeConfig
from tf_transformer.decoding.translator import Translator, translate_sentences
from tf_transformer.model import build_model
from tf_transformer import model_dir as model_dir_lib

LINES = SAMPLE_LINES[:7]
DECODE_FLAGS = ["--beam_size=1", "--extra_length=4", "--batch_size=2"]


@pytest.fixture(scope="module")
def translator(tiny_model_dir):
    decode = DecodeConfig(beam_size=1, extra_length=4, batch_size=2)
    return Translator.from_model_dir(tiny_model_dir, decode_config=decode)


def _translations(translator, lines):
    return [r.texts[0] for r in translate_sentences(translator, lines, batch_size=2)]


def _command(binary, *args):
    return [sys.executable, "-m", f"tf_transformer.{binary}", *args]


def _env():
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")


def _run(binary, *args, **kwargs):
    return subprocess.run(_command(binary, *args), cwd=REPO_ROOT, env=_env(), capture_output=True,
                          timeout=600, **kwargs)


@pytest.mark.slow
def test_file_output_in_chunks_equals_the_whole_file_at_once(tmp_path, tiny_model_dir, translator):
    """Also: an averaged model directory, the attention plot, progress lines on stderr."""
    averaged = str(tmp_path / "averaged")  # the mean of one checkpoint is itself
    model_dir_lib.write_averaged(tiny_model_dir, 1, averaged, build_model)
    source, output, plot = tmp_path / "in.txt", tmp_path / "out.txt", tmp_path / "attention.png"
    source.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    result = _run("translate", f"--model_dir={averaged}", f"--input={source}",
                  f"--output={output}", "--chunk_size=3", f"--plot_attention={plot}", *DECODE_FLAGS)
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    expected = _translations(translator, LINES)
    assert len(set(expected)) == len(LINES)
    assert output.read_text(encoding="utf-8").split("\n") == expected + [""]
    progress = re.findall(r"^translate: (\d+) sentences, ([\d.]+) sentences/s",
                          result.stderr.decode(), re.M)
    assert progress and int(progress[-1][0]) == len(LINES) and float(progress[-1][1]) > 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_pipe_answers_a_full_chunk_before_stdin_closes(tiny_model_dir, translator):
    process = subprocess.Popen(
        _command("translate", f"--model_dir={tiny_model_dir}", "--chunk_size=2", *DECODE_FLAGS),
        cwd=REPO_ROOT, env=_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stdout],
                     daemon=True).start()
    try:
        process.stdin.write(("\n".join(LINES[:2]) + "\n" + LINES[2] + "\n").encode())
        process.stdin.flush()
        first = [lines.get(timeout=300), lines.get(timeout=60)]  # the first chunk: 2 lines
        time.sleep(1)
        assert lines.empty() and process.poll() is None  # line 3 waits: chunk not full, stdin open
        process.stdin.close()
        process.wait(timeout=120)
    finally:
        process.kill()
    rest = []
    while not lines.empty():
        rest.append(lines.get())
    stderr = process.stderr.read().decode()
    assert process.returncode == 0, stderr[-3000:]
    got = [line.decode().rstrip("\n") for line in first + rest]
    assert got == _translations(translator, LINES[:3])
    assert "sentences/s" not in stderr  # no progress lines for stdin by default


@pytest.mark.slow
def test_evaluate_bleu_is_sacrebleu_on_the_hypotheses_it_wrote(tmp_path, tiny_model_dir,
                                                                translator):
    hypotheses = _translations(translator, LINES)
    # References: the model's own output for 4 lines (matches), the source for 3 (misses).
    references = hypotheses[:4] + LINES[4:]
    data, written = tmp_path / "dev.tsv", tmp_path / "hypotheses.txt"
    data.write_text("".join(f"{s}\t{r}\n" for s, r in zip(LINES, references)), encoding="utf-8")
    result = _run("evaluate", f"--model_dir={tiny_model_dir}", f"--data={data}",
                  f"--hypotheses={written}", *DECODE_FLAGS)
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    out = result.stdout.decode()
    figures = dict(re.findall(r"(\w+)=(\S+)", out.splitlines()[0]))
    assert written.read_text(encoding="utf-8").split("\n") == hypotheses + [""]
    bleu = BLEU().corpus_score(hypotheses, [references]).score
    assert 20 < bleu < 100  # the matched lines count, the others do not
    assert figures["bleu"] == f"{bleu:.2f}"
    assert figures["chrf"] == f"{CHRF().corpus_score(hypotheses, [references]).score:.2f}"
    assert figures["sentences"] == str(len(LINES)) and float(figures["sentences_per_sec"]) > 0
    assert re.search(r"^bleu_signature=nrefs:1\|.*tok:13a", out, re.M)
    assert re.search(r"^chrf_signature=", out, re.M)
    assert "paper-style tokenized BLEU" in out
    assert re.search(rf"^evaluate: {len(LINES)} sentences, [\d.]+ sentences/s \(done\)",
                     result.stderr.decode(), re.M)


def test_evaluate_refuses_missing_data_and_translate_only_flags(tiny_model_dir):
    result = _run("evaluate", f"--model_dir={tiny_model_dir}")
    assert result.returncode != 0 and b"--data is required" in result.stderr
    for flag in ("--nbest=2", "--input=x", "--plot_attention=x.png"):  # translate's, not its own
        result = _run("evaluate", f"--model_dir={tiny_model_dir}", "--data=x", flag)
        assert result.returncode != 0 and b"Unknown command line flag" in result.stderr, flag
