"""line_rules.py: the Python and graph forms judge each kind of line alike."""

import pytest
import tensorflow as tf

from tf_transformer.inputs import line_rules

# (raw TSV line, its reason) with max_chars=4; every reason once, and valid.
LINES = [(b"", "blank"), (b" \t ", "blank"), (b"ab\tcd", "valid"), (b"no tab", "no_tab"),
         (b"a\tb\tc", "extra_tab"), (b" \tb", "empty_side"), (b"\xff\tb", "invalid_utf8"),
         (b"abcde\tb", "too_long"), (b"\xe2\x80\x83x\t y", "valid")]  # an em space stripped


def _python_reason(tally: line_rules.Tally, raw: bytes) -> str:
    before = dict(tally.skipped)
    if tally.add_tsv_line(raw) is not None:
        return "valid"
    return next(r for r in tally.skipped if tally.skipped[r] != before.get(r, 0))


def test_the_python_and_graph_forms_give_every_line_the_same_reason():
    tally = line_rules.Tally("lines", max_chars=4)
    raw = [line for line, _ in LINES]
    assert [_python_reason(tally, r) for r in raw] == [reason for _, reason in LINES]
    *_, codes = line_rules.classify_tsv(tf.range(len(raw), dtype=tf.int64), tf.constant(raw), 4)
    names = line_rules.LINE_REASONS + ("valid",)
    assert [names[c] for c in codes.numpy()] == [reason for _, reason in LINES]
    assert dict(tally.skipped) == {"blank": 2, "empty_side": 1, "extra_tab": 1,
                                   "invalid_utf8": 1, "no_tab": 1, "too_long": 1}
    with pytest.raises(line_rules.CorpusError, match="mostly bad, 4 of 7 non-blank"):
        tally.check()


def test_mostly_bad_counts_only_malformed_lines():
    assert line_rules.mostly_bad({"no_tab": 2, "too_long": 5}, lines=4) is False
    assert line_rules.mostly_bad({"no_tab": 2, "invalid_utf8": 1}, lines=4) is True
