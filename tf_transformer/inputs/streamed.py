"""Corpora streamed from disk: tf.data reads the files, Python holds no pair.

`open_corpus(spec)` returns a `StreamedCorpus` for a TSV or `SRC,TGT`
spec, a `TfdsCorpus` for `tfds:wmt14_translate/...`. Opening it reads only
the first PROBE_LINES lines, with the rules of corpus.py, so a missing, empty
or mostly bad file fails at once with the same `CorpusError` as
`read_corpus`. Training reads it with `pairs(shard, tally)`:

  TextLineDataset -> enumerate (the line number is the pair's "index")
  -> shard by input pipeline (line i goes to pipeline i % n)
  -> LINE_BATCH lines at a time, classified in the graph by the rules of
     line_rules.py (blank, no_tab, extra_tab, empty_side, invalid_utf8, too_long)
  -> counted into a `StreamTally` as they go by, kept pairs unbatched.

A `StreamTally` logs its counts every REPORT_EVERY lines and at the end of each
pass, where the mostly-bad and no-valid-pair rules are checked over the whole
pass (raising `CorpusError` through the iterator). The pipeline also counts
there the pairs it drops as over `max_length` tokens, so no start-up
tokenising pass is needed. `texts()` streams both sides in Python for
SentencePiece, which samples them itself (tokenizer.py).
"""

from __future__ import annotations

import threading
from typing import Iterator

import numpy as np
import tensorflow as tf
from absl import logging

from tf_transformer.inputs import corpus as corpus_lib
from tf_transformer.inputs import line_rules
from tf_transformer.inputs.line_rules import LINE_REASONS, VALID, CorpusError

LINE_BATCH = 1024  # lines per classifying call: amortises per-call overhead
PROBE_LINES = 10_000
REPORT_EVERY = 1_000_000  # lines (or tokenised pairs) between progress logs


class StreamTally:
    """Skip counts of one stream, fed batch by batch from tf.data; thread-safe."""

    def __init__(self, name: str, report_every: int = REPORT_EVERY):
        self.name, self.report_every = name, report_every
        self._lock = threading.Lock()
        self._counts = np.zeros(VALID + 1, np.int64)  # this pass
        self.last_pass: dict[str, int] | None = None  # reason -> count, "valid" included
        self.passes = 0
        self.tokenized = self.over_length = 0  # cumulative, counted after the shuffle
        self._lines = 0  # cumulative, for the report cadence
        self._whole = False  # this pass was started here, not restored mid-way
        self._next_report = report_every

    def record(self, counts: np.ndarray | tf.Tensor) -> np.int64:
        """Adds one batch's [reasons..., valid] line counts."""
        with self._lock:
            counts = np.asarray(counts, np.int64)
            self._counts += counts
            self._lines += int(counts.sum())
            self._maybe_report()
        return np.int64(0)

    def record_lengths(self, checked: np.ndarray | tf.Tensor,
                       over: np.ndarray | tf.Tensor) -> np.int64:
        """Adds `over` of `checked` tokenised pairs over max_length (dropped)."""
        with self._lock:
            self.tokenized += int(checked)
            self.over_length += int(over)
            self._maybe_report()
        return np.int64(0)

    def _seen(self) -> int:
        return self._lines + self.tokenized

    def _maybe_report(self) -> None:
        if self._seen() >= self._next_report:
            self._next_report = self._seen() + self.report_every
            logging.info("%s: %s", self.name, self._summary(self._counts))

    def _summary(self, counts: np.ndarray) -> str:
        reasons = {r: int(n) for r, n in zip(LINE_REASONS, counts) if n}
        return (f"pass {self.passes + 1}: {int(counts[:VALID].sum() + counts[VALID])} lines, "
                f"{int(counts[VALID])} pairs kept, skipped {reasons}; over max_length so far "
                f"{self.over_length} of {self.tokenized} tokenised pairs")

    def start_pass(self) -> np.int64:
        with self._lock:
            self._counts[:] = 0
            self._whole = True
        return np.int64(0)

    def end_pass(self) -> np.int64:
        """Logs the pass's counts; CorpusError if it was empty, mostly bad or pairless.

        A pass entered by restoring an iterator checkpoint (no start seen here)
        covers only the lines read since: it is logged, not judged.
        """
        with self._lock:
            counts, self._counts = self._counts, np.zeros_like(self._counts)
            whole, self._whole = self._whole, False
            skipped = {r: int(n) for r, n in zip(LINE_REASONS, counts) if n}
            lines = int(counts.sum() - counts[0])  # non-blank
            malformed = line_rules.malformed_count(skipped)
            if whole and (lines == 0 or line_rules.mostly_bad(skipped, lines)
                          or not counts[VALID]):
                raise CorpusError(f"{self.name}: {lines} non-blank lines, {malformed} "
                                  f"malformed, {int(counts[VALID])} kept {skipped}: empty, "
                                  "mostly bad or no valid pair")
            logging.info("%s: end of %s%s", self.name, self._summary(counts),
                         "" if whole else " (resumed: lines since the restore only)")
            if whole:
                self.last_pass = {**skipped, "valid": int(counts[VALID])}
            self.passes += 1
        return np.int64(0)


class StreamedCorpus:
    """A TSV or SRC,TGT corpus read from disk each pass; holds paths, never pairs."""

    def __init__(self, spec: str, max_chars: int = line_rules.DEFAULT_MAX_CHARS,
                 probe_lines: int = PROBE_LINES):
        self.paths, self.reverse = corpus_lib.split_spec(spec)
        self.name, self.max_chars = spec, max_chars
        self.tallies: dict[tuple[int, int], StreamTally] = {}  # shard -> its latest pipeline's
        self._probe(probe_lines)

    def _scan(self, tally: line_rules.Tally) -> Iterator[tuple[str, str] | None]:
        if len(self.paths) == 2:
            scan = corpus_lib.scan_parallel(*self.paths, tally)
        else:
            scan = corpus_lib.scan_tsv(self.paths[0], tally)
        for pair in scan:
            yield pair[::-1] if pair and self.reverse else pair

    def _probe(self, probe_lines: int) -> None:
        tally = line_rules.Tally(self.name, self.max_chars)
        lines = 0
        for lines, _ in enumerate(self._scan(tally), start=1):
            if lines >= probe_lines:
                tally.check(complete=False)
                return
        tally.check(complete=True)  # the whole file was read

    @property
    def skipped(self) -> dict[str, int]:
        """Reason -> count over the last complete pass of every shard (blank included)."""
        total: dict[str, int] = {}
        for tally in self.tallies.values():
            for reason, n in (tally.last_pass or {}).items():
                if reason != "valid":
                    total[reason] = total.get(reason, 0) + n
        return dict(sorted(total.items()))

    def texts(self, side: str | None = None) -> Iterator[str]:
        """Both sides of each valid pair (or only `side`, "source" or "target"), read in
        Python as the file streams by."""
        keep = {None: slice(None), "source": slice(0, 1), "target": slice(1, 2)}[side]
        tally = line_rules.Tally(self.name, self.max_chars)
        for pair in self._scan(tally):
            if pair:
                yield from pair[keep]
        skipped = tally.check()
        logging.info("%s: %d pairs read, skipped %s", self.name, tally.valid, skipped)

    def _lines(self, shard: tuple[int, int]) -> tf.data.Dataset:
        """Batches of (index, source, target, code): pipeline `shard`'s lines, classified."""
        index, num = shard
        if len(self.paths) == 2:
            lines = _aligned(*self.paths).enumerate().shard(num, index).batch(LINE_BATCH)
            return lines.map(lambda i, pair: line_rules.classify_parallel(
                i, pair[0], pair[1], pair[2], pair[3], self.paths, self.max_chars),
                num_parallel_calls=tf.data.AUTOTUNE)
        lines = tf.data.TextLineDataset(self.paths[0]).enumerate()
        return lines.shard(num, index).batch(LINE_BATCH).map(
            lambda i, raw: line_rules.classify_tsv(i, raw, self.max_chars),
            num_parallel_calls=tf.data.AUTOTUNE)

    def pairs(self, shard: tuple[int, int] = (0, 1),
              tally: StreamTally | None = None) -> tf.data.Dataset:
        """One pass of {"index": int64 line number, "source", "target": string}.

        `shard=(i, n)` keeps lines i, i+n, ...; `tally` (new if None) counts them.
        """
        index, num = shard
        if tally is None:
            tally = StreamTally(f"{self.name} [{index}/{num}]")
        self.tallies[shard] = tally
        classified = self._lines(shard)

        def keep(i, source, target, code):
            counts = tf.math.bincount(code, minlength=VALID + 1, maxlength=VALID + 1,
                                      dtype=tf.int64)
            recorded = tf.py_function(tally.record, [counts], tf.int64)
            with tf.control_dependencies([recorded]):
                mask = tf.equal(code, VALID)
            if self.reverse:
                source, target = target, source
            return {"index": i[mask], "source": source[mask], "target": target[mask]}

        def marker(call):  # an empty batch whose only effect is `call`
            def fn(_):
                done = tf.py_function(call, [], tf.int64)
                with tf.control_dependencies([done]):
                    return {"index": tf.zeros([0], tf.int64), "source": tf.zeros([0], tf.string),
                            "target": tf.zeros([0], tf.string)}
            return tf.data.Dataset.from_tensors(0).map(fn)

        return (marker(tally.start_pass).concatenate(classified.map(keep))
                .concatenate(marker(tally.end_pass)).unbatch())


def _aligned(source_path: str, target_path: str) -> tf.data.Dataset:
    """(source, target, has_source, has_target) per line until both files end."""
    def side(path):
        lines = tf.data.TextLineDataset(path).map(lambda line: (line, True))
        return lines.concatenate(tf.data.Dataset.from_tensors((tf.constant(""), False)).repeat())

    both = tf.data.Dataset.zip(side(source_path), side(target_path))
    return both.take_while(lambda s, t: s[1] | t[1]).map(lambda s, t: (s[0], t[0], s[1], t[1]))


class TfdsCorpus(StreamedCorpus):
    """A TFDS `wmt14_translate` split read by tf.data from TFDS's files each pass.

    Holds the TFDS source, never pairs. Each input pipeline reads its own part:
    TFDS's `ReadConfig` carries the input context, so pipeline i of n reads every
    n-th file of the split; a split of fewer files than pipelines is sharded by
    example instead (each pipeline then reads every file). Pairs are checked by
    the rules of the parallel-file reader (no_tab and extra_tab cannot occur).
    """

    def __init__(self, spec: str, max_chars: int = line_rules.DEFAULT_MAX_CHARS,
                 probe_lines: int = PROBE_LINES, data_dir: str | None = None):
        self.source = corpus_lib.parse_tfds_spec(spec)
        self.paths, self.reverse = [spec, spec], False  # the direction is in `source`
        self.name, self.max_chars, self.data_dir = spec, max_chars, data_dir
        self.tallies: dict[tuple[int, int], StreamTally] = {}
        self._builder = self.source.builder(data_dir)
        self._probe(probe_lines)

    def examples(self, shard: tuple[int, int] = (0, 1)) -> tf.data.Dataset:
        """(source, target) string pairs of pipeline `shard` = (i, n), in TFDS's order."""
        tfds = corpus_lib.import_tfds()
        index, num = shard
        by_file = num > 1 and self._files() >= num
        read_config = tfds.ReadConfig(
            input_context=tf.distribute.InputContext(num, index, 1) if by_file else None)
        dataset = self._builder.as_dataset(split=self.source.split, read_config=read_config,
                                           shuffle_files=False)
        if num > 1 and not by_file:
            dataset = dataset.shard(num, index)
        source, target = self.source.source_lang, self.source.target_lang
        return dataset.map(lambda example: (example[source], example[target]))

    def _files(self) -> int:
        """Files of the split (0 when TFDS has no record of them, as under mock data)."""
        try:
            return len(self._builder.info.splits[self.source.split].file_instructions)
        except (KeyError, ValueError, AttributeError):
            return 0

    def _scan(self, tally: line_rules.Tally):
        tfds = corpus_lib.import_tfds()
        for raw_source, raw_target in tfds.as_numpy(self.examples()):
            yield tally.add_raw(raw_source, raw_target)

    def _lines(self, shard: tuple[int, int]) -> tf.data.Dataset:
        index, num = shard
        pairs = self.examples(shard).enumerate().map(
            lambda i, pair: (i * num + index, pair[0], pair[1]))  # unique over pipelines
        return pairs.batch(LINE_BATCH).map(
            lambda i, source, target: line_rules.classify_parallel(
                i, source, target, tf.ones_like(i, tf.bool), tf.ones_like(i, tf.bool),
                self.paths, self.max_chars), num_parallel_calls=tf.data.AUTOTUNE)


def open_corpus(spec: str, max_chars: int = line_rules.DEFAULT_MAX_CHARS):
    """The corpus a spec names, streamed from disk: a `TfdsCorpus` for
    `tfds:wmt14_translate/...`, else a `StreamedCorpus` (TSV or `SRC,TGT`).

    Both are checked now on their first pairs and read by tf.data at training
    time, and both work with `tokenizer.train_sentencepiece` and
    `pipeline.make_dataset`/`dataset_fn`.
    """
    if spec.removesuffix(corpus_lib.REVERSE_SUFFIX).startswith(corpus_lib.TFDS_PREFIX):
        return TfdsCorpus(spec, max_chars)
    return StreamedCorpus(spec, max_chars)
