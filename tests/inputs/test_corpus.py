"""Corpus readers: valid pairs kept in order, bad lines skipped and counted."""

import pytest

from tf_transformer.inputs import corpus
from tf_transformer.inputs.corpus import CorpusError


def write(path, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


GOOD = [("Open the file.", "Öffnen Sie die Datei."), ("Save", "Speichern"),
        ("Close the window.", "Schließen Sie das Fenster.")]


def good_lines(n=None) -> bytes:
    pairs = GOOD if n is None else [(f"s{i}", f"t{i}") for i in range(n)]
    return b"".join(f"{s}\t{t}\n".encode() for s, t in pairs)


def test_embedded_corpus(embedded_corpus):
    assert len(embedded_corpus) == 20000
    assert embedded_corpus.num_skipped == 0
    assert all(s and t for s, t in zip(embedded_corpus.sources[:100], embedded_corpus.targets))


def test_bad_lines_are_skipped_and_counted(tmp_path):
    data = (good_lines() + b"no tab here\n" + b"a\tb\tc\n" + b"  \tonly target\n"
            + b"only source\t \n" + b"bad \xff byte\tgut\n" + ("x" * 50 + "\tlong\n").encode()
            + b"\n" + b"last\tletzte\r\n")
    result = corpus.read_tsv(write(tmp_path / "mixed.tsv", data), max_chars=40)
    assert list(zip(result.sources, result.targets)) == GOOD + [("last", "letzte")]
    assert result.skipped == {"blank": 1, "empty_side": 2, "extra_tab": 1, "invalid_utf8": 1,
                              "no_tab": 1, "too_long": 1}
    assert result.num_skipped == 6


def test_mostly_bad_file_names_itself(tmp_path):
    path = write(tmp_path / "mostly_bad.tsv", good_lines(2) + b"one\ntwo\nthree\n")
    with pytest.raises(CorpusError, match="mostly_bad.tsv.*mostly bad"):
        corpus.read_tsv(path)
    # Half bad is still accepted: "mostly" means more than half.
    assert len(corpus.read_tsv(write(tmp_path / "half.tsv", good_lines(2) + b"a\nb\n"))) == 2


def test_missing_and_empty_files_name_themselves(tmp_path):
    with pytest.raises(CorpusError, match="nowhere.tsv"):
        corpus.read_tsv(str(tmp_path / "nowhere.tsv"))
    with pytest.raises(CorpusError, match="empty.tsv.*empty"):
        corpus.read_tsv(write(tmp_path / "empty.tsv", b""))
    with pytest.raises(CorpusError, match="blank.tsv"):
        corpus.read_tsv(write(tmp_path / "blank.tsv", b"\n\n  \n"))
    with pytest.raises(CorpusError, match="long.tsv.*no valid pair"):
        corpus.read_tsv(write(tmp_path / "long.tsv", good_lines()), max_chars=3)


def test_parallel_files(tmp_path):
    source = write(tmp_path / "x.en", b"one\ntwo\n\xffbad\nfour\n\n")
    target = write(tmp_path / "x.de", b"eins\n\ndrei\nvier\n\n")
    result = corpus.read_parallel(source, target)
    assert list(zip(result.sources, result.targets)) == [("one", "eins"), ("four", "vier")]
    assert result.skipped == {"blank": 1, "empty_side": 1, "invalid_utf8": 1}
    short = write(tmp_path / "short.de", b"eins\n")
    with pytest.raises(CorpusError, match="short.de ends before line 2"):
        corpus.read_parallel(source, short)


def test_read_corpus_specs(tmp_path):
    tsv = write(tmp_path / "a.tsv", good_lines())
    assert corpus.read_corpus(tsv).sources == [s for s, _ in GOOD]
    assert corpus.read_corpus(tsv + ":reverse").sources == [t for _, t in GOOD]
    source = write(tmp_path / "b.en", b"one\ntwo\n")
    target = write(tmp_path / "b.de", b"eins\nzwei\n")
    parallel = corpus.read_corpus(f"{source},{target}")
    assert parallel.targets == ["eins", "zwei"]
    assert corpus.read_corpus(f"{source},{target}:reverse").sources == ["eins", "zwei"]
    with pytest.raises(CorpusError, match="only tfds:wmt14_translate"):
        corpus.read_corpus("tfds:imdb_reviews")


def test_write_tsv_round_trip(tmp_path):
    original = corpus.Corpus(["a\tb", "c"], ["d", "e  f"])
    path = str(tmp_path / "out.tsv")
    corpus.write_tsv(original, path)
    assert corpus.read_tsv(path).sources == ["a b", "c"]


def test_tfds_wmt14_with_mock_data():
    tfds = pytest.importorskip("tensorflow_datasets")
    with tfds.testing.mock_data(num_examples=8):
        de_en = corpus.read_corpus("tfds:wmt14_translate/de-en:train")
    with tfds.testing.mock_data(num_examples=8):
        en_de = corpus.read_tfds_wmt14("en-de", split="train")
    with tfds.testing.mock_data(num_examples=8):
        reversed_ = corpus.read_corpus("tfds:wmt14_translate/de-en:validation:reverse")
    assert len(de_en) + de_en.num_skipped == 8 and len(de_en) > 0
    assert en_de.sources == de_en.targets and en_de.targets == de_en.sources
    assert "en->de" in en_de.name and len(reversed_) > 0
    with pytest.raises(CorpusError, match="pair"):
        corpus.read_tfds_wmt14("de-fr")
