"""TFDS for training, streamed (streamed.TfdsCorpus) on mock data: the same pairs as the
in-memory reader, each input pipeline its own part (TFDS's ReadConfig carries the input
context when the split has a file per pipeline), and batches from the usual pipeline."""

import pytest
import tensorflow as tf

from tf_transformer.config import DataConfig
from tf_transformer.inputs import corpus, pipeline, streamed

tfds = pytest.importorskip("tensorflow_datasets")
SPEC = "tfds:wmt14_translate/en-de:train"


def _pairs(dataset):
    return [(s.decode(), t.decode()) for s, t in
            ((p["source"], p["target"]) for p in dataset.as_numpy_iterator())]


def test_streamed_tfds_holds_the_in_memory_readers_pairs_split_by_pipeline(small_tokenizer):
    with tfds.testing.mock_data(num_examples=12):
        stream = streamed.open_corpus(SPEC)
        whole = corpus.read_corpus(SPEC)
        assert isinstance(stream, streamed.TfdsCorpus) and "en->de" in stream.source.name
        one = _pairs(stream.pairs((0, 1)))
        parts = [_pairs(stream.pairs((i, 2))) for i in range(2)]
        batches = list(pipeline.make_dataset(
            stream, small_tokenizer, DataConfig(max_length=32, tokens_per_batch=128,
                                                shuffle_buffer=20), training=True)
            .take(3).as_numpy_iterator())
    assert one == list(zip(whole.sources, whole.targets)) and len(one) == 12
    assert sorted(parts[0] + parts[1]) == sorted(one) and len(parts[0]) == 6
    assert len(batches) == 3 and all(b["source"].shape[1] <= 32 for b in batches)


def test_a_split_of_enough_files_is_read_by_file_through_the_input_context(monkeypatch):
    """With a file per pipeline TFDS reads pipeline i's files (ReadConfig.input_context);
    the mock's reader here returns its pipeline's examples only."""
    contexts = []

    def as_dataset(self, split, decoders=None, read_config=None, shuffle_files=False):
        context = read_config.input_context  # None for the whole split (the probe)
        if context is not None:
            contexts.append((context.input_pipeline_id, context.num_input_pipelines))
        i = context.input_pipeline_id if context else 0
        return tf.data.Dataset.from_tensor_slices(
            {"en": [f"source {i} {n}" for n in range(3)],
             "de": [f"target {i} {n}" for n in range(3)]})

    monkeypatch.setattr(streamed.TfdsCorpus, "_files", lambda self: 4)
    with tfds.testing.mock_data(num_examples=3, as_dataset_fn=as_dataset):
        stream = streamed.TfdsCorpus(SPEC, probe_lines=1)
        parts = [_pairs(stream.pairs((i, 2))) for i in range(2)]
    assert contexts == [(0, 2), (1, 2)]
    assert parts[1] == [(f"source 1 {n}", f"target 1 {n}") for n in range(3)]
