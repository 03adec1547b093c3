"""Host-side batching (tf_transformer/cli/batching.py) and the streaming loop over it: the
sentences tokenized once, batches shortest first, results in input order.

A stand-in translator tokenizes on spaces and a stand-in decode_batch echoes its batch,
so what is counted is the host's work, not a model's."""

import io
import types

import tensorflow as tf

from tf_transformer.cli import streaming
from tf_transformer.cli.batching import translate_sentences

SENTENCES = ["a b c d", "a", "a b c", "", "a b", "a b c d e"]


class _CountingTokenizer:
    """Words as tokens; counts its tokenize calls."""

    def __init__(self):
        self.calls = 0

    def tokenize(self, text: tf.Tensor) -> tf.RaggedTensor:
        self.calls += 1
        return tf.strings.split(text)


def _echo(batches: list):
    """A DecodeBatch that records its batches and answers each sentence with itself."""
    def decode(text: tf.Tensor) -> dict:
        batches.append([t.decode() for t in text.numpy()])
        words = tf.strings.split(text).row_lengths()
        return {"translations": text[:, None], "scores": -tf.cast(words, tf.float32)[:, None],
                "lengths": tf.cast(words + 1, tf.int32)[:, None]}
    return decode


def _translator():
    return types.SimpleNamespace(tokenizer=_CountingTokenizer())


def test_sentences_are_tokenized_once_and_batched_shortest_first():
    translator, batches, done = _translator(), [], []
    results = translate_sentences(translator, SENTENCES, batch_size=4,
                                  decode_batch=_echo(batches), on_batch=done.append)
    assert translator.tokenizer.calls == 1
    assert batches == [["", "a", "a b", "a b c"], ["a b c d", "a b c d e"]]
    assert done == [4, 2]
    assert [r.texts for r in results] == [[s] for s in SENTENCES]  # input order
    assert [r.source_tokens for r in results] == [4, 1, 3, 0, 2, 5]
    assert [r.lengths for r in results] == [[5], [2], [4], [1], [3], [6]]
    assert results[0].alignments is None and results[0].target_tokens is None
    assert translate_sentences(translator, [], decode_batch=_echo(batches)) == []


def test_a_streamed_chunk_is_sorted_once_and_reports_each_batch():
    """translate_sorted hands its sort to translate_sentences: one tokenize call per chunk
    (it sorted the chunk, then each batch again), progress counted per batch."""
    translator, batches = _translator(), []
    progress = streaming.Progress("translated", stream=io.StringIO(), every_s=1e9)
    chunks = list(streaming.translate_chunks(translator, SENTENCES, chunk_size=3, batch_size=2,
                                             progress=progress, decode_batch=_echo(batches)))
    assert translator.tokenizer.calls == 2  # two chunks
    assert batches == [["a", "a b c"], ["a b c d"], ["", "a b"], ["a b c d e"]]
    assert [r.texts[0] for chunk in chunks for r in chunk] == SENTENCES
    assert progress.done == len(SENTENCES)
