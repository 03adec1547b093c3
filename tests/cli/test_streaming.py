"""Line reading, chunked translation and progress lines (tf_transformer/cli/streaming.py).

The translations are checked against `translate_sentences` on the whole input
at once, the path the translate binary took before it streamed.
"""

import io
import os
import random
import threading

import numpy as np
import pytest

from tf_transformer.config import DecodeConfig
from tf_transformer.cli import streaming
from tf_transformer.cli.streaming import split_lines
from tf_transformer.cli.batching import translate_sentences
from tf_transformer.decoding.translator import Translator
from tf_transformer.model.transformer import build_model

from model_fixtures import SAMPLE_LINES, tiny_config

LINES = SAMPLE_LINES


@pytest.fixture(scope="module")
def translator(small_tokenizer):
    """A tiny model (seeded random weights, one layer each side: its two searches trace
    every layer), sources up to 64 tokens. Batches of at most 3: one search each
    (parallel_searches=1: one copy of the loop per graph, faster to trace)."""
    decode = DecodeConfig(beam_size=3, nbest=3, extra_length=6, batch_size=2,
                          parallel_searches=1)
    random.seed(0)  # Keras draws initializer seeds from Python's and NumPy's generators
    np.random.seed(0)
    config = tiny_config(small_tokenizer.vocab_size, num_layers=1)
    return Translator(build_model(config.model), small_tokenizer, decode,
                      config.data.max_length)


def _stream(translator, data: bytes, **kwargs) -> list[str]:
    out = io.StringIO()
    summary = streaming.translate_stream(translator, io.BytesIO(data), out, **kwargs)
    lines = out.getvalue().split("\n")
    assert lines[-1] == "" and summary.lines == len(split_lines(data)[0])
    return lines[:-1]


def test_split_lines_never_fails():
    assert split_lines(b"") == ([], [])
    assert split_lines(b"a\n\nb\r\n") == (["a", "", "b"], [])
    assert split_lines(b"a\nb") == (["a", "b"], [])
    assert split_lines(b"a\r\r\nb\r") == (["a\r", "b"], [])  # one "\r" dropped per line
    lines, replaced = split_lines(b"ok \xef\xbf\xbd\nbad \xff\n\xc3\n")  # a real U+FFFD first
    assert lines == ["ok \ufffd", "bad \ufffd", "\ufffd"] and replaced == [1, 2]


def test_read_lines_yields_a_line_before_the_writer_closes():
    read_fd, write_fd = os.pipe()
    with open(read_fd, "rb") as reader, open(write_fd, "wb", buffering=0) as writer:
        writer.write(b"first \xff\nsecond")
        lines = streaming.read_lines(reader)
        got = []
        thread = threading.Thread(target=lambda: got.append(next(lines)))
        thread.start()
        thread.join(timeout=10)
        assert got == [("first \ufffd", True)]  # the writer is still open
        writer.close()
        assert list(lines) == [("second", False)]


def test_chunked_output_equals_the_whole_input_at_once(translator):
    whole = translate_sentences(translator, LINES, batch_size=2)
    expected = [r.texts[0] for r in whole]
    assert len(set(expected)) == len(LINES)
    data = ("\n".join(LINES) + "\n").encode()
    assert _stream(translator, data, batch_size=2, chunk_size=3) == expected
    assert _stream(translator, data, batch_size=3, chunk_size=100) == expected
    assert _stream(translator, b"", batch_size=2, chunk_size=2) == []

    nbest = translate_sentences(translator, LINES[:5], batch_size=2, nbest=True)
    lines = _stream(translator, "\n".join(LINES[:5]).encode(), batch_size=2, chunk_size=2,
                    nbest=True)  # no final "\n"
    # Other batch neighbours change float rounding in the 6th digit, not the hypotheses.
    expected = [(n, score, text) for n, r in enumerate(nbest) for text, score in zip(r.texts, r.scores)]
    got = [(int(n), float(score), text) for n, score, text in (l.split("\t") for l in lines)]
    assert [(n, t) for n, _, t in got] == [(n, t) for n, _, t in expected]
    assert [s for _, s, _ in got] == pytest.approx([s for _, s, _ in expected], abs=1e-4)
    assert [int(line.split("\t")[0]) for line in lines] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3,
                                                           4, 4, 4]


def test_each_chunk_is_written_before_the_next_is_read(translator):
    consumed, seen_at_write = [], []

    class Source:
        def __iter__(self):
            for line in LINES:
                consumed.append(line)
                yield line.encode() + b"\n"

    class Out(io.StringIO):
        def flush(self):
            seen_at_write.append((len(self.getvalue().splitlines()), len(consumed)))

    streaming.translate_stream(translator, Source(), Out(), batch_size=2, chunk_size=3)
    # (lines written, lines read) at each flush: 3 lines read, 3 written, and so on.
    assert seen_at_write == [(3, 3), (6, 6), (8, 8)]


def test_bad_lines_are_counted_over_the_whole_stream(translator, caplog):
    data = b"\n".join([b"Fonts", b"", b"bad \xff\xfe bytes \xc3", " ".join(["word"] * 5000).encode(),
                       b"   ", b"Replacement table\r", b""])  # ends with an empty line
    lines = _stream(translator, data + b"\n", batch_size=3, chunk_size=2)
    assert len(lines) == 7
    assert lines[1] == "" and lines[4] == "" and lines[6] == ""
    assert all(lines[i] for i in (0, 2, 3, 5))
    warnings = "\n".join(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert "1 input lines (0-based: 2): invalid UTF-8" in warnings
    assert "3 input lines (0-based: 1, 4, 6): empty" in warnings
    assert "1 input lines (0-based: 3): over 63 tokens, truncated" in warnings


def test_line_issue_shows_the_first_ten_and_counts_all(caplog):
    issue = streaming.LineIssue("empty")
    for n in range(0, 30, 2):
        issue.add(n)
    issue.warn()
    assert "15 input lines (0-based: 0, 2, 4, 6, 8, 10, 12, 14, 16, 18 ...): empty" in caplog.text


def test_progress_lines_count_sentences_and_rate(translator):
    now = [100.0]
    stream = io.StringIO()
    progress = streaming.Progress("translate", stream, every_s=10.0, clock=lambda: now[0])
    for step in range(4):  # 0, 4, 8, 12 s: a line at 12 s (10 s since the start)
        now[0] = 100.0 + 4 * step
        progress.add(5)
    now[0] = 125.0
    progress.finish()
    assert stream.getvalue().splitlines() == [
        "translate: 20 sentences, 1.67 sentences/s",
        "translate: 20 sentences, 0.80 sentences/s (done)"]

    stream = io.StringIO()
    progress = streaming.Progress("evaluate", stream, every_s=0.0)
    results = streaming.translate_sorted(translator, LINES[:5], batch_size=2, progress=progress)
    assert [r.texts for r in results] == [
        r.texts for r in translate_sentences(translator, LINES[:5], batch_size=2)]
    counts = [line.split(" sentences,")[0] for line in stream.getvalue().splitlines()]
    assert counts == ["evaluate: 2", "evaluate: 4", "evaluate: 5"]  # one line per batch
