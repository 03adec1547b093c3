"""Parallel corpora: read source/target pairs, skip and count bad lines.

Every binary takes its corpus as one spec string (see `read_corpus`):

  data/libreoffice-help.en-de/train.tsv      a TSV file, `source<TAB>target` a line
  train.en,train.de                          two line-aligned text files
  tfds:wmt14_translate/de-en:train           TensorFlow Datasets (de -> en)
  tfds:wmt14_translate/en-de:train           the same pairs, en -> de
  SPEC:reverse                               any of the above, directions swapped

`read_corpus` holds the pairs in memory (dev and test sets); streamed.py's
`open_corpus` streams text files and TFDS from disk (training corpora of any size).

A bad pair is skipped and counted under one reason, never dropped silently
(line_rules.py: `no_tab`, `extra_tab` (TSV only), `empty_side`, `invalid_utf8`,
`too_long`; blank lines are counted as `blank` but are not bad). The counts are
logged once per reader call. A mostly bad source (line_rules.py), a missing file,
or a source with no valid pair raises `CorpusError` naming the file.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from typing import Iterable, Iterator

import tensorflow as tf
from absl import logging

from tf_transformer.inputs.line_rules import DEFAULT_MAX_CHARS, CorpusError, Tally

REVERSE_SUFFIX = ":reverse"
TFDS_PREFIX = "tfds:"
WMT14_PAIRS = ("de-en", "fr-en")  # the TFDS configs; either direction is read


@dataclasses.dataclass
class Corpus:
    """Valid pairs in reading order, and what was skipped (reason -> count)."""

    sources: list[str]
    targets: list[str]
    skipped: dict[str, int] = dataclasses.field(default_factory=dict)
    name: str = ""

    def __post_init__(self):
        if len(self.sources) != len(self.targets):
            raise CorpusError(f"{self.name}: {len(self.sources)} sources but "
                              f"{len(self.targets)} targets")

    def __len__(self) -> int:
        return len(self.sources)

    @property
    def num_skipped(self) -> int:
        return sum(n for reason, n in self.skipped.items() if reason != "blank")

    def reversed(self) -> "Corpus":
        """The same pairs with source and target swapped."""
        return Corpus(self.targets, self.sources, dict(self.skipped), self.name + REVERSE_SUFFIX)

    def texts(self) -> Iterator[str]:
        """Both sides, for training one shared vocabulary."""
        yield from self.sources
        yield from self.targets


def _checked_corpus(tally: Tally, pairs: list[tuple[str, str]]) -> Corpus:
    """The pairs as a Corpus once `tally` passes its check; the counts logged."""
    skipped = tally.check()
    corpus = Corpus([s for s, _ in pairs], [t for _, t in pairs], skipped, tally.name)
    if corpus.num_skipped:
        logging.warning("%s: %d pairs read, %d skipped %s", tally.name, len(corpus),
                        corpus.num_skipped, skipped)
    else:
        logging.info("%s: %d pairs read, none skipped", tally.name, len(corpus))
    return corpus


def _open_lines(path: str) -> Iterator[bytes]:
    """Raw lines without their line ending (gfile: local, gs://); a missing file names itself."""
    if not tf.io.gfile.exists(path):
        raise CorpusError(f"{path}: no such file")
    with tf.io.gfile.GFile(path, "rb") as f:
        first = True
        for line in f:
            if first and line.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark
                line = line[3:]
            first = False
            yield line.rstrip(b"\r\n")


def scan_tsv(path: str, tally: Tally) -> Iterator[tuple[str, str] | None]:
    """Per line of `path`, its valid pair or None (the reason counted in `tally`)."""
    for raw in _open_lines(path):
        yield tally.add_tsv_line(raw)


def scan_parallel(source_path: str, target_path: str,
                  tally: Tally) -> Iterator[tuple[str, str] | None]:
    """Per line of two line-aligned files, its valid pair or None (reason in `tally`)."""
    sources, targets = _open_lines(source_path), _open_lines(target_path)
    for raw_source, raw_target in _zip_strict(sources, targets, source_path, target_path):
        if not raw_source.strip() and not raw_target.strip():
            tally.blank()
            yield None
        else:
            yield tally.add_raw(raw_source, raw_target)


def read_tsv(path: str, max_chars: int = DEFAULT_MAX_CHARS) -> Corpus:
    """Reads `source<TAB>target` lines from `path`."""
    tally = Tally(path, max_chars)
    return _checked_corpus(tally, [pair for pair in scan_tsv(path, tally) if pair])


def read_parallel(source_path: str, target_path: str,
                  max_chars: int = DEFAULT_MAX_CHARS) -> Corpus:
    """Reads two line-aligned files; line n of one translates line n of the other."""
    tally = Tally(f"{source_path},{target_path}", max_chars)
    return _checked_corpus(tally, [pair for pair in scan_parallel(source_path, target_path,
                                                                   tally) if pair])


def _zip_strict(a: Iterator[bytes], b: Iterator[bytes], a_name: str,
                b_name: str) -> Iterator[tuple[bytes, bytes]]:
    for n, (x, y) in enumerate(itertools.zip_longest(a, b), start=1):
        if x is None or y is None:
            short = a_name if x is None else b_name
            raise CorpusError(f"{a_name},{b_name}: not line-aligned, {short} ends "
                              f"before line {n}")
        yield x, y


@dataclasses.dataclass(frozen=True)
class TfdsSource:
    """A TFDS `wmt14_translate` split in one direction (`tfds_source` parses a spec)."""

    config: str  # the TFDS config: "de-en" or "fr-en"
    split: str  # any TFDS split string, e.g. "train" or "train[:1%]"
    source_lang: str
    target_lang: str

    @property
    def name(self) -> str:
        return (f"{TFDS_PREFIX}wmt14_translate/{self.config}:{self.split} "
                f"({self.source_lang}->{self.target_lang})")

    def builder(self, data_dir: str | None = None):
        """The TFDS builder, prepared (downloaded on first use; TFDS's data_dir or
        $TFDS_DATA_DIR by default)."""
        tfds = import_tfds()
        builder = tfds.builder(f"wmt14_translate/{self.config}", data_dir=data_dir)
        builder.download_and_prepare()
        return builder


def import_tfds():
    try:
        import tensorflow_datasets as tfds  # imported only by the TFDS readers
    except ImportError as e:
        raise CorpusError("reading wmt14_translate needs tensorflow-datasets: "
                          "pip install tensorflow-datasets") from e
    return tfds


def tfds_source(pair: str = "de-en", split: str = "train", reverse: bool = False) -> TfdsSource:
    """`pair` is `source-target`, e.g. "en-de": the TFDS configs are `de-en` and
    `fr-en`, and `pair` may name either direction ("en-de" reads the `de-en`
    config with English as the source); `reverse` swaps it again."""
    source_lang, _, target_lang = pair.partition("-")
    config = f"{source_lang}-{target_lang}"
    if config not in WMT14_PAIRS:
        config = f"{target_lang}-{source_lang}"
    if config not in WMT14_PAIRS:
        raise CorpusError(f"wmt14_translate pair {pair!r}: expected one of "
                          f"{WMT14_PAIRS} in either direction")
    if reverse:
        source_lang, target_lang = target_lang, source_lang
    return TfdsSource(config, split, source_lang, target_lang)


def parse_tfds_spec(spec: str) -> TfdsSource:
    """`tfds:wmt14_translate/PAIR[:SPLIT][:reverse]` (SPLIT defaults to train)."""
    reverse = spec.endswith(REVERSE_SUFFIX)
    if reverse:
        spec = spec[:-len(REVERSE_SUFFIX)]
    name, _, split = spec[len(TFDS_PREFIX):].partition(":")
    dataset, _, pair = name.partition("/")
    if dataset != "wmt14_translate" or not pair:
        raise CorpusError(f"{spec}: only tfds:wmt14_translate/PAIR[:SPLIT] is supported")
    return tfds_source(pair, split or "train", reverse)


def read_tfds_wmt14(pair: str = "de-en", split: str = "train", reverse: bool = False,
                    data_dir: str | None = None,
                    max_chars: int = DEFAULT_MAX_CHARS) -> Corpus:
    """Reads TFDS `wmt14_translate` into memory (dev and test sets; training streams
    it: streamed.TfdsCorpus); `pair` as in `tfds_source`."""
    source = tfds_source(pair, split, reverse)
    tfds = import_tfds()
    dataset = source.builder(data_dir).as_dataset(split=split)
    tally, pairs = Tally(source.name, max_chars), []
    for example in tfds.as_numpy(dataset):
        pair = tally.add_raw(example[source.source_lang], example[source.target_lang])
        if pair:
            pairs.append(pair)
    return _checked_corpus(tally, pairs)


def read_corpus(spec: str, max_chars: int = DEFAULT_MAX_CHARS) -> Corpus:
    """Reads the corpus a spec names; the spec syntax is in the module docstring.

    `tfds:wmt14_translate/PAIR[:SPLIT]` (SPLIT defaults to train; any TFDS split
    string, e.g. `train[:1%]`), `SRC_PATH,TGT_PATH`, or a TSV path; any of them
    may end in `:reverse` to swap source and target.
    """
    if spec.removesuffix(REVERSE_SUFFIX).startswith(TFDS_PREFIX):
        source = parse_tfds_spec(spec)
        return read_tfds_wmt14(f"{source.source_lang}-{source.target_lang}", source.split,
                               max_chars=max_chars)
    reverse = spec.endswith(REVERSE_SUFFIX)
    if reverse:
        spec = spec[:-len(REVERSE_SUFFIX)]
    paths, _ = split_spec(spec)
    if len(paths) == 2:
        corpus = read_parallel(*paths, max_chars=max_chars)
    else:
        corpus = read_tsv(paths[0], max_chars=max_chars)
    return corpus.reversed() if reverse else corpus


def split_spec(spec: str) -> tuple[list[str], bool]:
    """A file spec -> ([TSV path] or [source path, target path], reverse)."""
    reverse = spec.endswith(REVERSE_SUFFIX)
    if reverse:
        spec = spec[:-len(REVERSE_SUFFIX)]
    if "," in spec and not os.path.exists(spec):
        return spec.split(",", 1), reverse
    return [spec], reverse


def write_tsv(corpus: Corpus | Iterable[tuple[str, str]], path: str) -> None:
    """Writes pairs as `source<TAB>target` lines (tabs inside a side become spaces)."""
    pairs = zip(corpus.sources, corpus.targets) if isinstance(corpus, Corpus) else corpus
    with open(path, "w", encoding="utf-8") as f:
        for source, target in pairs:
            f.write(f"{_one_line(source)}\t{_one_line(target)}\n")


def _one_line(text: str) -> str:
    return " ".join(text.replace("\t", " ").split())
