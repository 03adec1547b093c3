"""The translate and evaluate binaries on the tiny model, run as users run them.

Expected outputs come from the library in this process with the same decoding
settings: `translate_sentences` over the whole input at once, the path the
translate binary took before it streamed. Runs that read and write files run in this
process (binary_fixtures.run_main: absl's flags parsed, main called, streams captured,
the exit code a process would give), and so do the refusals; what only a process shows
stays a subprocess: a pipe answered chunk by chunk.
"""

import fcntl
import os
import platform
import re
import select
import struct
import subprocess
import sys
import termios
import time

import pytest
from binary_fixtures import run_main, run_mains
from model_fixtures import GREEDY_DECODE, REPO_ROOT, SAMPLE_LINES, shared_translator
from sacrebleu.metrics import BLEU, CHRF

from tf_transformer.cli.batching import translate_sentences
from tf_transformer.model import build_model
from tf_transformer import model_dir as model_dir_lib
from tf_transformer.model_dir import ModelDir

LINES = SAMPLE_LINES[:7]
# model_fixtures.GREEDY_DECODE's settings. One search per batch (batches of 2 are never
# split): one copy of the search loop per graph, faster to trace and optimise.
DECODE_FLAGS = ["--beam_size=1", "--extra_length=5", "--batch_size=2", "--parallel_searches=1"]


@pytest.fixture(scope="module")
def translator(tiny_model_dir):
    """The library's Translator with DECODE_FLAGS' settings (the evaluation tests' too)."""
    return shared_translator(tiny_model_dir, GREEDY_DECODE)


def _translations(translator, lines):
    return [r.texts[0] for r in translate_sentences(translator, lines, batch_size=2)]


def _command(binary, *args):
    return [sys.executable, "-m", f"tf_transformer.{binary}", *args]


def _env():
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")


@pytest.fixture(scope="module")
def translate_runs(tmp_path_factory, tiny_model_dir):
    """The translate binary on a file of LINES, in this process: "chunks" (an averaged model
    directory, --output, --chunk_size=3, --plot_attention) and "sampling" (--sampling_topk=1,
    stdout); each {"code", "stdout", "stderr"}, with the files of "chunks"."""
    directory = tmp_path_factory.mktemp("translate")
    averaged = str(directory / "averaged")  # the mean of one checkpoint is itself
    model_dir_lib.write_averaged(ModelDir(tiny_model_dir), 1, ModelDir(averaged), build_model)
    source, output, plot = directory / "in.txt", directory / "out.txt", directory / "attention.png"
    source.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    argvs = {"chunks": [f"--model_dir={averaged}", f"--input={source}", f"--output={output}",
                        "--chunk_size=3", f"--plot_attention={plot}", *DECODE_FLAGS],
             "sampling": [f"--model_dir={tiny_model_dir}", f"--input={source}",
                          "--sampling_topk=1", "--seed=3", *DECODE_FLAGS]}
    runs = dict(zip(argvs, run_mains("tf_transformer.translate", list(argvs.values()))))
    runs["chunks"].update(output=output, plot=plot)
    return runs


@pytest.mark.slow
def test_file_output_in_chunks_equals_the_whole_file_at_once(translate_runs, translator):
    """Also: an averaged model directory, the attention plot, progress lines on stderr."""
    result = translate_runs["chunks"]
    assert result["code"] == 0, result["stderr"][-3000:]
    expected = _translations(translator, LINES)
    assert len(set(expected)) == len(LINES)
    assert result["output"].read_text(encoding="utf-8").split("\n") == expected + [""]
    progress = re.findall(r"^translate: (\d+) sentences, ([\d.]+) sentences/s",
                          result["stderr"], re.M)
    assert progress and int(progress[-1][0]) == len(LINES) and float(progress[-1][1]) > 0
    assert result["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _read_lines(fd, count, timeout):
    """Reads the raw pipe `fd` until it has given `count` lines, at most `timeout` s in
    all; returns every byte read (a whole line more than asked for included)."""
    data, deadline = b"", time.monotonic() + timeout
    while data.count(b"\n") < count:
        if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            raise AssertionError(f"{count} lines not written in {timeout} s: {data!r}")
        chunk = os.read(fd, 1 << 16)
        assert chunk, f"output ended after {data!r}"
        data += chunk
    return data


def _read_to_end(fd, timeout):
    data, deadline = b"", time.monotonic() + timeout
    while select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return data
        data += chunk
    raise AssertionError(f"output not closed in {timeout} s: {data!r}")


_READ_SYSCALL = {"x86_64": 0, "aarch64": 63}  # Linux system call numbers of read(2)


def _wait_until_reading_stdin(pid, timeout):
    """Returns once the main thread of `pid` is blocked in read(0, ...): waiting for input.

    Linux's /proc/PID/syscall holds the number and arguments of the system call a blocked
    thread is in (the main thread's id is the process id)."""
    if platform.system() != "Linux" or platform.machine() not in _READ_SYSCALL:
        pytest.skip("reads /proc/PID/syscall: Linux on x86_64 or aarch64")
    read, deadline = str(_READ_SYSCALL[platform.machine()]), time.monotonic() + timeout
    while True:
        with open(f"/proc/{pid}/syscall") as f:
            fields = f.read().split()
        if fields[:2] == [read, "0x0"]:
            return
        assert time.monotonic() < deadline, f"not reading stdin after {timeout} s: {fields}"
        time.sleep(0.01)


def _unread_bytes(pipe):
    """Bytes written into `pipe` (our end) that the other end has not read yet."""
    return struct.unpack("i", fcntl.ioctl(pipe.fileno(), termios.FIONREAD, b"\0" * 4))[0]


@pytest.mark.slow
def test_pipe_answers_a_full_chunk_before_stdin_closes(tmp_path, tiny_model_dir, translator):
    """--chunk_size=2 and three lines in one write: the first chunk is answered while
    stdin is open, the third line only once stdin closes.

    No clock decides it: once the binary has answered the first chunk and blocks reading
    stdin again, it has taken all three lines (nothing is left unread in the pipe) and
    the third's answer, had it been written, would be in its output pipe: it must be
    empty. Then stdin closes and the third answer follows."""
    stderr_path = tmp_path / "stderr.txt"
    with open(stderr_path, "wb") as stderr:  # a file: a full stderr pipe cannot block it
        process = subprocess.Popen(
            _command("translate", f"--model_dir={tiny_model_dir}", "--chunk_size=2",
                     *DECODE_FLAGS),
            cwd=REPO_ROOT, env=_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=stderr)
    out = process.stdout.fileno()  # read raw: nothing buffered out of select's sight
    try:
        process.stdin.write(("\n".join(LINES[:2]) + "\n" + LINES[2] + "\n").encode())
        process.stdin.flush()
        first = _read_lines(out, 2, timeout=300)
        assert first.count(b"\n") == 2 and first.endswith(b"\n")  # the first chunk only
        _wait_until_reading_stdin(process.pid, timeout=60)
        assert _unread_bytes(process.stdin) == 0  # it has taken line 3...
        assert not select.select([out], [], [], 0)[0]  # ...and not answered it
        assert process.poll() is None  # chunk not full, stdin open: line 3 waits
        process.stdin.close()
        rest = _read_to_end(out, timeout=120)
        process.wait(timeout=120)
    finally:
        process.kill()
    stderr = stderr_path.read_text(encoding="utf-8", errors="replace")
    assert process.returncode == 0, stderr[-3000:]
    assert rest.count(b"\n") == 1  # line 3, after stdin closed
    got = (first + rest).decode().split("\n")
    assert got == _translations(translator, LINES[:3]) + [""]
    assert "sentences/s" not in stderr  # no progress lines for stdin by default


@pytest.mark.slow
def test_evaluate_bleu_is_sacrebleu_on_the_hypotheses_it_wrote(tmp_path, tiny_model_dir,
                                                                translator):
    hypotheses = _translations(translator, LINES)
    # References: the model's own output for 4 lines (matches), the source for 3 (misses).
    references = hypotheses[:4] + LINES[4:]
    data, written = tmp_path / "dev.tsv", tmp_path / "hypotheses.txt"
    data.write_text("".join(f"{s}\t{r}\n" for s, r in zip(LINES, references)), encoding="utf-8")
    result = run_main("tf_transformer.evaluate", [
        f"--model_dir={tiny_model_dir}", f"--data={data}", f"--hypotheses={written}",
        *DECODE_FLAGS])
    assert result["code"] == 0, result["stderr"][-3000:]
    out = result["stdout"]
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
                     result["stderr"], re.M)


def test_evaluate_refuses_missing_data_and_translate_only_flags(tiny_model_dir):
    """All four runs in this process (run_mains)."""
    flags = ("--nbest=2", "--input=x", "--plot_attention=x.png")  # translate's, not its own
    missing, *unknown = run_mains("tf_transformer.evaluate", [
        [f"--model_dir={tiny_model_dir}"],
        *([f"--model_dir={tiny_model_dir}", "--data=x", flag] for flag in flags)])
    assert missing["code"] != 0 and "--data is required" in missing["stderr"]
    for flag, result in zip(flags, unknown, strict=True):
        assert result["code"] != 0 and "Unknown command line flag" in result["stderr"], flag


@pytest.mark.slow
def test_sampling_flags_top_k_one_is_the_greedy_output(translate_runs, translator):
    """--sampling_topk=1 draws the most probable token: the beam of one's output."""
    result = translate_runs["sampling"]
    assert result["code"] == 0, result["stderr"][-3000:]
    assert result["stdout"].split("\n") == _translations(translator, LINES) + [""]


def test_translate_refuses_sampling_with_nbest_or_alignments(tiny_model_dir):
    """Both runs in this process (run_mains)."""
    cases = (["--nbest=2"], ["--with_alignments=hard"])
    runs = run_mains("tf_transformer.translate",
                     [[f"--model_dir={tiny_model_dir}", "--sampling_topp=0.9", *flags]
                      for flags in cases])
    for flags, result in zip(cases, runs, strict=True):
        assert result["code"] != 0 and "sampling draws one output" in result["stderr"], flags
