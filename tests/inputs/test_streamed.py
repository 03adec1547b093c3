"""Streamed corpora: the in-memory reader's pairs and counts, read by tf.data from disk."""

import collections
import inspect
import logging
import os

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.config import DataConfig
from tf_transformer.inputs import corpus, pipeline, stats, streamed, tokenizer
from tf_transformer.inputs.corpus import CorpusError

EMBEDDED_TRAIN = os.path.join(os.path.dirname(__file__), "..", "..", "data",
                              "libreoffice-help.en-de", "train.tsv")
# One line per reason of corpus.py, plus what a real file holds: a byte-order mark, CRLF,
# a side of Unicode spaces only, an encoded surrogate (invalid UTF-8), tabs inside a side.
MIXED = ("\ufeffOpen the file.\tÖffnen Sie die Datei.\r\n".encode() + b"no tab here\n"
         + b"a\tb\tc\n" + b"  \tonly target\n" + "\u00a0\u3000\tnur Leerzeichen\n".encode()
         + b"bad \xff byte\tgut\n" + b"sur \xed\xa0\x80\tx\n" + ("x" * 50 + "\tlong\n").encode()
         + b"\n" + b" \t \n" + "\u2003trim me\u2003\t ok \n".encode() + b"Save\tSpeichern\n" * 4
         + b"last\tletzte\r\n")


def write(path, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


def head(tmp_path, lines: int) -> str:
    with open(EMBEDDED_TRAIN, "rb") as f:
        return write(tmp_path / f"head{lines}.tsv", b"".join(f.readlines()[:lines]))


def streamed_pairs(data: streamed.StreamedCorpus, shard=(0, 1)) -> list[tuple[str, str]]:
    pairs = []
    for batch in data.pairs(shard).batch(4096).as_numpy_iterator():
        pairs += [(s.decode(), t.decode()) for s, t in zip(batch["source"], batch["target"])]
    return pairs


def test_same_pairs_and_counts_as_the_in_memory_reader(embedded_corpus):
    data = streamed.open_corpus(EMBEDDED_TRAIN)
    assert isinstance(data, streamed.StreamedCorpus)
    assert (collections.Counter(streamed_pairs(data))
            == collections.Counter(zip(embedded_corpus.sources, embedded_corpus.targets)))
    assert data.skipped == embedded_corpus.skipped and data.tallies[0, 1].last_pass == {
        "valid": len(embedded_corpus)}


@pytest.mark.parametrize("spec_suffix", ["", ":reverse"])
def test_bad_lines_are_counted_as_the_in_memory_reader_counts_them(tmp_path, spec_suffix):
    spec = write(tmp_path / "mixed.tsv", MIXED) + spec_suffix
    expected = corpus.read_corpus(spec, max_chars=40)
    data = streamed.open_corpus(spec, max_chars=40)
    assert streamed_pairs(data) == list(zip(expected.sources, expected.targets))
    assert data.skipped == expected.skipped
    assert set(expected.skipped) == set(streamed.LINE_REASONS)  # every reason exercised
    sharded = streamed.open_corpus(spec, max_chars=40)
    pairs = streamed_pairs(sharded, (0, 2)) + streamed_pairs(sharded, (1, 2))
    assert sorted(pairs) == sorted(zip(expected.sources, expected.targets))
    assert sharded.skipped == expected.skipped  # the shards' counts add up


def test_parallel_files_are_counted_as_the_in_memory_reader_counts_them(tmp_path):
    source = write(tmp_path / "x.en",
                   b"\xef\xbb\xbfone\ntwo\n\xffbad\nfour\n\n \xe2\x80\x83\n" + b"a\n" * 3)
    target = write(tmp_path / "x.de", b"eins\n\ndrei\nvier\n\nsechs\n" + b"b\n" * 3)
    expected = corpus.read_corpus(f"{source},{target}")
    data = streamed.open_corpus(f"{source},{target}")
    assert streamed_pairs(data) == list(zip(expected.sources, expected.targets))
    assert data.skipped == expected.skipped == {"blank": 1, "empty_side": 2, "invalid_utf8": 1}
    longer = write(tmp_path / "long.de", b"eins\nzwei\ndrei\nvier\nfuenf\nsechs\n" + b"b\n" * 4)
    with pytest.raises(tf.errors.InvalidArgumentError, match="not line-aligned"):
        streamed_pairs(streamed.StreamedCorpus(f"{source},{longer}", probe_lines=2))


def test_invalid_utf8_line_is_skipped_and_counted(tmp_path):
    path = write(tmp_path / "one_bad.tsv", b"good\tgut\nbad \xc3\x28\tschlecht\nfine\tfein\n")
    data = streamed.open_corpus(path)
    assert streamed_pairs(data) == [("good", "gut"), ("fine", "fein")]
    assert data.skipped == {"invalid_utf8": 1}


def test_shards_by_input_context_are_disjoint_and_cover_the_corpus(tmp_path, small_tokenizer):
    path = head(tmp_path, 600)
    config = DataConfig(tokens_per_batch=512, deterministic=True)
    fn = pipeline.dataset_fn(streamed.open_corpus(path), small_tokenizer, config, training=False)
    shards = []
    for pipeline_id in range(3):
        context = tf.distribute.InputContext(num_input_pipelines=3, input_pipeline_id=pipeline_id,
                                             num_replicas_in_sync=3)
        shards.append(collections.Counter(
            int(i) for b in fn(context).as_numpy_iterator() for i in b["index"]))
    assert all(max(s.values()) == 1 for s in shards)  # each line once in its shard
    assert sum(shards, collections.Counter()) == collections.Counter(range(600))
    assert all(i % 3 == n for n, s in enumerate(shards) for i in s)


def test_the_corpus_is_read_from_disk_not_held(tmp_path):
    path = head(tmp_path, 300)
    data = streamed.open_corpus(path)
    assert set(vars(data)) == {"paths", "reverse", "name", "max_chars", "tallies"}
    assert inspect.isgenerator(data.texts())
    write(path, b"new\tneu\n" * 5)  # read at iteration time, so the new content is what comes
    assert streamed_pairs(data) == [("new", "neu")] * 5


def test_missing_empty_and_mostly_bad_files_fail_at_open(tmp_path):
    with pytest.raises(CorpusError, match="nowhere.tsv: no such file"):
        streamed.open_corpus(str(tmp_path / "nowhere.tsv"))
    with pytest.raises(CorpusError, match="empty.tsv.*empty"):
        streamed.open_corpus(write(tmp_path / "empty.tsv", b"\n\n"))
    with pytest.raises(CorpusError, match="bad.tsv.*mostly bad"):
        streamed.open_corpus(write(tmp_path / "bad.tsv", b"a\tb\n" + b"no tab\n" * 3))


def test_mostly_bad_past_the_probe_fails_at_the_end_of_the_pass(tmp_path, caplog):
    path = write(tmp_path / "late.tsv", b"a\tb\n" * 4 + b"no tab\n" * 6)
    data = streamed.StreamedCorpus(path, probe_lines=4)
    with pytest.raises(tf.errors.OpError, match="late.tsv.*mostly bad"):
        streamed_pairs(data)


def test_counts_are_logged_periodically_and_at_the_end_of_each_pass(tmp_path, caplog):
    data = streamed.open_corpus(write(tmp_path / "log.tsv", b"a\tb\n" * 3000 + b"x\n" * 10))
    tally = streamed.StreamTally("log.tsv", report_every=1000)
    with caplog.at_level(logging.INFO, logger="absl"):  # parsed absl flags set WARNING
        dataset = data.pairs((0, 1), tally).repeat(2)
        assert sum(1 for _ in dataset.batch(4096)) == 2
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("log.tsv")]
    ends = [line for line in lines if "end of pass" in line]
    assert len(lines) - len(ends) >= 4  # 6020 lines, a report every 1000
    assert ends == [f"log.tsv: end of pass {k}: 3010 lines, 3000 pairs kept, skipped "
                    "{'no_tab': 10}; over max_length so far 0 of 0 tokenised pairs"
                    for k in (1, 2)]
    assert tally.last_pass == {"no_tab": 10, "valid": 3000} and tally.passes == 2


def test_over_length_pairs_are_counted_as_they_stream(tmp_path, embedded_corpus,
                                                      small_tokenizer):
    path = head(tmp_path, 1500)
    in_memory = corpus.read_tsv(path)
    data = streamed.open_corpus(path)
    config = DataConfig(max_length=24, tokens_per_batch=512, deterministic=True)
    figures = stats.epoch_stats(pipeline.make_dataset(data, small_tokenizer, config,
                                                      training=True, repeat=False))
    over = stats.count_over_length(in_memory, small_tokenizer, 24)
    tally, = data.tallies.values()
    assert 0 < over and (tally.over_length, tally.tokenized) == (over, 1500)
    assert figures["examples"] == 1500 - over


def test_sentencepiece_samples_a_streamed_corpus(tmp_path):
    data = streamed.open_corpus(head(tmp_path, 1000))
    first = tokenizer.train_sentencepiece(data, 400)
    assert first == tokenizer.train_sentencepiece(data, 400)  # seeded sample
    sampled = tokenizer.train_sentencepiece(data, 400, max_sentences=200)
    assert sampled != first and tokenizer.Tokenizer(sampled).vocab_size == 400
    sources = tokenizer.Tokenizer(tokenizer.train_sentencepiece(data, 400, side="source"))
    german = tf.constant(["Öffnen Sie die Datei über das Menü."])
    assert (sources.tokenize(german).flat_values.shape[0]  # no German merges in it
            > tokenizer.Tokenizer(first).tokenize(german).flat_values.shape[0])
    ids = tokenizer.Tokenizer(first).tokenize(tf.constant(["Open the file."]))
    assert np.all(ids.flat_values.numpy() > 3)


@pytest.mark.parametrize("reader", [corpus.read_tsv, streamed.open_corpus])
def test_iterator_checkpoint_resumes_the_stream_exactly(tmp_path, small_tokenizer, reader):
    """tf.data's iterator checkpoint holds the file position; the counters are left out."""
    path = head(tmp_path, 300)
    config = DataConfig(tokens_per_batch=512, shuffle_buffer=100, deterministic=True)

    def iterator():
        return iter(pipeline.make_dataset(reader(path), small_tokenizer, config, training=True))

    first = iterator()
    for _ in range(3):
        next(first)
    saved = tf.train.Checkpoint(iterator=first).save(str(tmp_path / "ckpt" / "it"))
    expected = [next(first)["source"].numpy() for _ in range(20)]  # past the end of a pass
    resumed = iterator()  # as in a new process: new corpus, pipeline and counters
    tf.train.Checkpoint(iterator=resumed).restore(saved)
    for want in expected:
        got = next(resumed)["source"].numpy()
        assert got.shape == want.shape and np.array_equal(got, want)
