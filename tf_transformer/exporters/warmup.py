"""Warmup requests: TF Serving's (assets.extra/tf_serving_warmup_requests) and the same
batches as JSON (assets.extra/warmup_requests.json) for any loader, and their sentences.

The batches visit every pair of search/shape_buckets.py's row buckets (up to MAX_BATCH
sentences) and source-width buckets (up to the model's positions), each with outputs as
long as its width's sentence gives, so a server has met the shapes of its searches before
its first request and memory stays flat after it (export/serving/README.md).
"""

from __future__ import annotations

import functools
import json
import os
from typing import Callable, Sequence

import tensorflow as tf

from tf_transformer.search import shape_buckets

WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
WARMUP_JSON = os.path.join("assets.extra", "warmup_requests.json")
MAX_BATCH = 32  # the largest batch warmed up (TF Serving's max_batch_size to match)


def sentences_per_width(sentences: Sequence[str], width_of: Callable[[str], int],
                        max_width: int) -> list[str]:
    """One sentence per bucket of shape_buckets.width_buckets(max_width): the words of
    `sentences` in turn, as few as reach the bucket's width (`width_of`: a text's source
    width, EOS included, as the search sees it), or one word fewer where they pass it."""
    words = " ".join(sentences).split()
    if not words:
        return []

    def text(count):
        return " ".join(words[i % len(words)] for i in range(count))

    @functools.cache
    def width(count):  # each count's text tokenized once
        return width_of(text(count))

    wide = []
    for bucket in shape_buckets.width_buckets(max_width):
        low, high = 1, 2
        while width(high) < bucket:
            low, high = high, 2 * high
        while low < high:  # the fewest words whose width reaches the bucket
            middle = (low + high) // 2
            low, high = (middle + 1, high) if width(middle) < bucket else (low, middle)
        wide.append(text(high if width(high) == bucket else max(high - 1, 1)))
    return wide


def warmup_batches(sentences: Sequence[str], wide: Sequence[str] = (),
                   max_batch: int = MAX_BATCH) -> list[list[str]]:
    """Batches of 1 (each sentence, shortest first), then each of `wide` (one sentence
    per width bucket: `sentences_per_width`) repeated to each row bucket up to
    `max_batch`."""
    alone = [[s] for s in sorted(sentences, key=len)]
    return alone + [[s] * rows for s in wide for rows in shape_buckets.row_buckets(max_batch)]


def write_warmup_requests(path: str, sentences: Sequence[str], model_name: str,
                          wide: Sequence[str] = (), nbest_request: bool = True) -> int:
    """Writes TF Serving's warmup file: a TFRecord of PredictionLog protos, and beside
    it WARMUP_JSON, a list of {"signature", "text"}: the same requests for other loaders.

    One PredictRequest per batch of `warmup_batches(sentences, wide)`, for
    serving_default, and the sentences once more for translate_nbest (`nbest_request`:
    an export that has it). Returns the number of records.
    """
    from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

    requests = [("serving_default", batch) for batch in warmup_batches(sentences, wide)]
    if sentences and nbest_request:
        requests.append(("translate_nbest", list(sentences)))
    tf.io.gfile.makedirs(os.path.dirname(path))
    with open(os.path.join(os.path.dirname(path), os.path.basename(WARMUP_JSON)), "w",
              encoding="utf-8") as f:
        json.dump([{"signature": signature, "text": batch} for signature, batch in requests],
                  f, ensure_ascii=False, indent=0)
    with tf.io.TFRecordWriter(path) as writer:
        for signature, batch in requests:
            request = predict_pb2.PredictRequest()
            request.model_spec.name = model_name
            request.model_spec.signature_name = signature
            request.inputs["text"].CopyFrom(tf.make_tensor_proto(batch, dtype=tf.string))
            log = prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())
    return len(requests)


def read_warmup_requests(path: str) -> list:
    """The PredictRequests of a warmup file, in order."""
    from tensorflow_serving.apis import prediction_log_pb2

    logs = []
    for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
        logs.append(prediction_log_pb2.PredictionLog.FromString(record).predict_log.request)
    return logs


def read_sentences(path: str, limit: int | None = None) -> list[str]:
    """Non-empty lines of a text file (the source column of a TSV)."""
    with open(path, encoding="utf-8") as f:
        lines = [line.rstrip("\n").split("\t")[0] for line in f]
    lines = [line for line in lines if line.strip()]
    return lines[:limit] if limit else lines
