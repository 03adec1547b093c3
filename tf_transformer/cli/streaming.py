"""Text in, text out, chunk by chunk: the translate binary's loop, with progress lines.

Input is read one line at a time; every `chunk_size` lines (and at the end)
the chunk is sorted by source length, translated in batches and written back in
input order, then flushed. Memory is bounded by the chunk, not the input, and
in a pipe a line is answered once its chunk is full or the input ends.

Lines follow `wc -l`: split on "\\n" only, one trailing "\\r" dropped, invalid
UTF-8 decoded as U+FFFD. Bad lines never stop a run; each kind (invalid UTF-8,
empty, over-long) is counted over the whole stream and logged once at the end.

Each batch runs the beam search (cli/batching.py: beam_batches), or another
`decode_batch` (cli/decoders.py: sampling, alignments), given target prefixes each
output continuing its line's prefix (a second stream, line for line); with an alignment format
(cli/alignments.py) each output line ends in a TAB and its alignment.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import sys
import time
from typing import BinaryIO, Callable, Iterable, Iterator, NamedTuple, TextIO

from absl import logging

from tf_transformer.cli import alignments as alignment_formats
from tf_transformer.cli.batching import DecodeBatch, Translation, translate_sentences
from tf_transformer.decoding.translator import Translator

_REPLACEMENT = "\ufffd".encode()


def decode_line(raw: bytes) -> tuple[str, bool]:
    """One raw line (its "\\n" included or not) -> (text, whether bytes were replaced)."""
    raw = raw[:-1] if raw.endswith(b"\n") else raw
    raw = raw[:-1] if raw.endswith(b"\r") else raw
    text = raw.decode("utf-8", errors="replace")
    return text, text.count("\ufffd") != raw.count(_REPLACEMENT)


def read_lines(stream: BinaryIO) -> Iterator[tuple[str, bool]]:
    """Lines of a binary stream as decode_line results, read as they arrive."""
    for raw in stream:
        yield decode_line(raw)


def split_lines(data: bytes) -> tuple[list[str], list[int]]:
    """Raw text -> (lines, numbers of the lines with invalid UTF-8), never failing."""
    lines, replaced = [], []
    for n, (text, bad) in enumerate(read_lines(io.BytesIO(data))):
        lines.append(text)
        if bad:
            replaced.append(n)
    return lines, replaced


@dataclasses.dataclass
class LineIssue:
    """Input lines with one problem: how many, and the first few numbers (0-based)."""

    what: str
    count: int = 0
    first: list = dataclasses.field(default_factory=list)
    shown: int = 10

    def add(self, line_number: int) -> None:
        self.count += 1
        if len(self.first) < self.shown:
            self.first.append(line_number)

    def warn(self) -> None:
        if self.count:
            numbers = ", ".join(map(str, self.first)) + (" ..." if self.count > self.shown else "")
            logging.warning("%d input lines (0-based: %s): %s", self.count, numbers, self.what)


class Progress:
    """`PREFIX: N sentences, R sentences/s` lines: at most one per `every_s`, and a final one."""

    def __init__(self, prefix: str, stream: TextIO | None = None, every_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic):
        self.prefix, self.stream, self.every_s, self.clock = prefix, stream, every_s, clock
        self.done = 0
        self._start = self._last = clock()

    def add(self, sentences: int) -> None:
        self.done += sentences
        now = self.clock()
        if now - self._last >= self.every_s:
            self._last = now
            self._write(now, "")

    def finish(self) -> None:
        self._write(self.clock(), " (done)")

    def _write(self, now: float, suffix: str) -> None:
        rate = self.done / max(now - self._start, 1e-9)
        print(f"{self.prefix}: {self.done} sentences, {rate:.2f} sentences/s{suffix}",
              file=self.stream or sys.stderr, flush=True)


def translate_sorted(translator: Translator, sentences: list[str], batch_size: int,
                     nbest: bool = False, progress: Progress | None = None,
                     decode_batch: DecodeBatch | None = None,
                     prefixes: list[str] | None = None) -> list[Translation]:
    """translate_sentences (one sort, shortest sources first), reporting each batch to `progress`."""
    return translate_sentences(translator, sentences, batch_size, nbest, decode_batch,
                               on_batch=progress.add if progress is not None else None,
                               prefixes=prefixes)


class PrefixLinesError(ValueError):
    """The target prefixes' lines do not pair one to one with the input's."""


def translate_chunks(translator: Translator, sentences: Iterable[str], chunk_size: int,
                     batch_size: int, nbest: bool = False, progress: Progress | None = None,
                     decode_batch: DecodeBatch | None = None,
                     prefixes: Iterable[str] | None = None) -> Iterator[list[Translation]]:
    """Each chunk of `chunk_size` sentences (the last may be shorter), translated, in order;
    `prefixes`: one target prefix per sentence, taken along."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    sentences = iter(sentences)
    prefixes = None if prefixes is None else iter(prefixes)
    read = 0
    while chunk := list(itertools.islice(sentences, chunk_size)):
        chunk_prefixes = None if prefixes is None else list(itertools.islice(prefixes, len(chunk)))
        if chunk_prefixes is not None and len(chunk_prefixes) < len(chunk):
            raise PrefixLinesError(f"the target prefixes end after {read + len(chunk_prefixes)} "
                                   "lines, before the input")
        read += len(chunk)
        yield translate_sorted(translator, chunk, batch_size, nbest, progress, decode_batch,
                               chunk_prefixes)
    if prefixes is not None and next(prefixes, None) is not None:
        raise PrefixLinesError(f"the target prefixes have more lines than the input ({read})")


class StreamSummary(NamedTuple):
    lines: int
    first_line: str | None  # for the attention plot


def translate_stream(translator: Translator, source: BinaryIO, out: TextIO, *,
                     batch_size: int, chunk_size: int, nbest: bool = False,
                     progress: Progress | None = None, decode_batch: DecodeBatch | None = None,
                     alignment_format: str | None = None,
                     prefix_source: BinaryIO | None = None) -> StreamSummary:
    """Translates `source` line by line into `out`.

    One output line per input line, or with `nbest` translator.nbest lines
    `index<TAB>score<TAB>text` (index: the input line, from 0); with
    `alignment_format` ("hard" or "soft": cli/alignments.py; `decode_batch` must
    give alignments) each line then ends in `<TAB>alignment` (TABs in the text
    become spaces). Output is flushed after each chunk. Warnings for bad lines are
    logged at the end. `prefix_source`: one target prefix per input line ("" for none),
    each output continuing its prefix (PrefixLinesError when the lines do not pair up).
    """
    replaced = LineIssue("invalid UTF-8 bytes replaced by U+FFFD")
    empty = LineIssue("empty, translated as empty")
    limit = translator.max_source_length - 1
    truncated = LineIssue(f"over {limit} tokens, truncated (the model's maximum source length)")
    first: list[str] = []

    def lines():
        for n, (text, bad) in enumerate(read_lines(source)):
            if n == 0:
                first.append(text)
            if bad:
                replaced.add(n)
            if not text.strip():
                empty.add(n)
            yield text

    n = 0
    prefixes = None if prefix_source is None else (text for text, _ in read_lines(prefix_source))
    for chunk in translate_chunks(translator, lines(), chunk_size, batch_size, nbest, progress,
                                  decode_batch, prefixes):
        for result in chunk:
            if result.source_tokens > limit:
                truncated.add(n)
            texts = [t.replace("\n", " ").replace("\r", " ") for t in result.texts]
            if alignment_format:
                write = alignment_formats.FORMATS[alignment_format]
                texts = [t.replace("\t", " ") + "\t" + write(a, tokens) for t, a, tokens
                         in zip(texts, result.alignments, result.target_tokens)]
            if nbest:
                out.writelines(f"{n}\t{score:.6f}\t{text}\n"
                               for text, score in zip(texts, result.scores))
            else:
                out.write(texts[0] + "\n")
            n += 1
        out.flush()
    for issue in (replaced, empty, truncated):
        issue.warn()
    return StreamSummary(n, first[0] if first else None)
