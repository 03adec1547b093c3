"""The bad-line rules every corpus reader applies, in one place.

A line (or an aligned pair of lines, or a TFDS example) is, in this order of precedence:

  blank         only whitespace (both lines of a pair): skipped, not bad
  invalid_utf8  a side that is not UTF-8
  no_tab        a TSV line without a TAB
  extra_tab     a TSV line with more than one TAB
  empty_side    a side empty once stripped
  too_long      a stripped side over `max_chars` characters (a length filter, not damage)
  valid         the pair of stripped sides is kept

A source is *mostly bad* when more than half of its non-blank lines are `MALFORMED`
(every reason but too_long).

The rules have two forms: `Tally` judges lines in Python (the in-memory readers,
the streamed readers' probes, the score binary), `classify_tsv`/`classify_parallel`
judge batches of lines in the graph (tf.data, training's streamed corpora). Both are
here so a rule changes in both at once; tests/inputs/test_streamed.py checks that the
two count every reason alike.
"""

from __future__ import annotations

import collections
from typing import Mapping

import tensorflow as tf

DEFAULT_MAX_CHARS = 2048  # per side; the longest shared-corpus side has 1170
LINE_REASONS = ("blank", "no_tab", "extra_tab", "empty_side", "invalid_utf8", "too_long")
MALFORMED = ("no_tab", "extra_tab", "empty_side", "invalid_utf8")
VALID = len(LINE_REASONS)  # the graph form's code of a kept line; counts are [reasons..., valid]
_ASCII_SPACE = r"[ \t\n\r\x0b\x0c]*"  # bytes.strip()
_SPACE = r"[\t-\r\x{1c}-\x{1f}\x{85}\p{Z}]"  # str.strip(): str.isspace() characters
_STRIP = rf"^{_SPACE}+|{_SPACE}+$"
_UTF8 = r"[\x{0}-\x{D7FF}\x{E000}-\x{10FFFF}]*"  # bytes.decode("utf-8") accepts: no surrogates


class CorpusError(ValueError):
    """A corpus that is missing, empty or mostly malformed."""


def malformed_count(skipped: Mapping[str, int]) -> int:
    """Lines skipped for a MALFORMED reason."""
    return sum(skipped.get(reason, 0) for reason in MALFORMED)


def mostly_bad(skipped: Mapping[str, int], lines: int) -> bool:
    """Whether more than half of `lines` non-blank lines are malformed."""
    return malformed_count(skipped) * 2 > lines


def decode(raw: bytes) -> str | None:
    """UTF-8 text, or None for invalid UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


class Tally:
    """Judges lines in Python and counts them by reason; enforces the mostly-bad rule.

    Holds no pairs: the readers keep or stream the pairs `add` returns."""

    def __init__(self, name: str, max_chars: int):
        self.name, self.max_chars = name, max_chars
        self.skipped: collections.Counter = collections.Counter()
        self.lines = 0  # non-blank
        self.valid = 0

    def add(self, source: str, target: str) -> tuple[str, str] | None:
        """The stripped pair if it is valid, else None (and its reason counted)."""
        self.lines += 1
        source, target = source.strip(), target.strip()
        if not source or not target:
            self.skipped["empty_side"] += 1
        elif len(source) > self.max_chars or len(target) > self.max_chars:
            self.skipped["too_long"] += 1
        else:
            self.valid += 1
            return source, target
        return None

    def add_raw(self, raw_source: bytes, raw_target: bytes) -> tuple[str, str] | None:
        """`add` for undecoded sides (parallel files, TFDS): invalid UTF-8 counted first."""
        source, target = decode(raw_source), decode(raw_target)
        if source is None or target is None:
            self.bad("invalid_utf8")
            return None
        return self.add(source, target)

    def add_tsv_line(self, raw: bytes) -> tuple[str, str] | None:
        """`add` for one raw `source<TAB>target` line (its line ending removed)."""
        if not raw.strip():
            self.blank()
            return None
        line = decode(raw)
        if line is None:
            self.bad("invalid_utf8")
            return None
        fields = line.split("\t")
        if len(fields) != 2:
            self.bad("no_tab" if len(fields) < 2 else "extra_tab")
            return None
        return self.add(*fields)

    def blank(self) -> None:
        self.skipped["blank"] += 1

    def bad(self, reason: str) -> None:
        self.lines += 1
        self.skipped[reason] += 1

    def check(self, complete: bool = True) -> dict[str, int]:
        """Raises CorpusError for an empty, mostly bad or (if `complete`) pairless source."""
        skipped = dict(sorted(self.skipped.items()))
        if self.lines == 0:
            raise CorpusError(f"{self.name}: empty, no pairs to read")
        if mostly_bad(skipped, self.lines):
            raise CorpusError(
                f"{self.name}: mostly bad, {malformed_count(skipped)} of {self.lines} non-blank "
                f"lines are malformed ({skipped}); is this the right file and format "
                "(UTF-8, `source<TAB>target` a line)?")
        if complete and not self.valid:
            raise CorpusError(f"{self.name}: no valid pair left ({skipped})")
        return skipped


# --- The graph form: [n] lines -> (index, source, target, code), code an index of
# LINE_REASONS or VALID.

def _strip(text: tf.Tensor) -> tf.Tensor:
    return tf.strings.regex_replace(text, _STRIP, "")


def _side_code(source: tf.Tensor, target: tf.Tensor, max_chars: int) -> tf.Tensor:
    """empty_side, too_long or valid for stripped sides, as Tally.add."""
    empty = tf.equal(source, "") | tf.equal(target, "")
    too_long = ((tf.strings.length(source, unit="UTF8_CHAR") > max_chars)
                | (tf.strings.length(target, unit="UTF8_CHAR") > max_chars))
    return tf.where(empty, LINE_REASONS.index("empty_side"),
                    tf.where(too_long, LINE_REASONS.index("too_long"), VALID))


def _valid_utf8(raw: tf.Tensor) -> tf.Tensor:
    # RE2 matches only well-formed UTF-8 (8x faster here than unicode_transcode).
    return tf.strings.regex_full_match(raw, _UTF8)


def _without_bom(index: tf.Tensor, raw: tf.Tensor) -> tf.Tensor:
    """Drops a UTF-8 byte-order mark from line 0; only the batch holding it pays."""
    def strip():
        return tf.where(tf.equal(index, 0), tf.strings.regex_replace(raw, "^\ufeff", ""), raw)

    return tf.cond(tf.reduce_any(tf.equal(index, 0)), strip, lambda: raw)


def classify_tsv(index: tf.Tensor, raw: tf.Tensor, max_chars: int):
    """[n] raw lines -> (index, source, target, code): Tally.add_tsv_line's rules."""
    raw = _without_bom(index, raw)
    fields = tf.strings.split(raw, "\t", maxsplit=2)
    padded = fields.to_tensor("", shape=[None, 3])
    source, target = _strip(padded[:, 0]), _strip(padded[:, 1])
    count = fields.row_lengths()
    code = tf.where(count < 2, LINE_REASONS.index("no_tab"),
                    tf.where(count > 2, LINE_REASONS.index("extra_tab"),
                             _side_code(source, target, max_chars)))
    code = tf.where(_valid_utf8(raw), code, LINE_REASONS.index("invalid_utf8"))
    code = tf.where(tf.strings.regex_full_match(raw, _ASCII_SPACE), 0, code)
    return index, source, target, code


def classify_parallel(index, raw_source, raw_target, has_source, has_target,
                      paths: list[str], max_chars: int):
    """[n] aligned raw lines -> (index, source, target, code): Tally.add_raw's rules,
    blank when both lines are; a line one file lacks fails as not line-aligned."""
    aligned = tf.reduce_all(tf.equal(has_source, has_target))
    check = tf.debugging.Assert(aligned, [f"{paths[0]},{paths[1]}: not line-aligned, "
                                          "one file ends before line",
                                          index[tf.argmax(has_source != has_target)] + 1])
    with tf.control_dependencies([check]):
        raw_source = _without_bom(index, raw_source)
    raw_target = _without_bom(index, raw_target)
    source, target = _strip(raw_source), _strip(raw_target)
    code = _side_code(source, target, max_chars)
    code = tf.where(_valid_utf8(raw_source) & _valid_utf8(raw_target), code,
                    LINE_REASONS.index("invalid_utf8"))
    blank = (tf.strings.regex_full_match(raw_source, _ASCII_SPACE)
             & tf.strings.regex_full_match(raw_target, _ASCII_SPACE))
    return index, source, target, tf.where(blank, 0, code)
