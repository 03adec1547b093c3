"""TF Serving warmup requests (assets.extra/tf_serving_warmup_requests) and their sentences."""

from __future__ import annotations

import os
from typing import Sequence

import tensorflow as tf

WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")


def warmup_batches(sentences: Sequence[str]) -> list[list[str]]:
    """Batches of 1 (each sentence, shortest first) and one batch of all of them."""
    ordered = sorted(sentences, key=len)
    return [[s] for s in ordered] + ([list(ordered)] if len(ordered) > 1 else [])


def write_warmup_requests(path: str, sentences: Sequence[str], model_name: str) -> int:
    """Writes TF Serving's warmup file: a TFRecord of PredictionLog protos.

    One PredictRequest per batch of `warmup_batches`, for serving_default and,
    for the largest batch, translate_nbest. Returns the number of records.
    """
    from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

    requests = [("serving_default", batch) for batch in warmup_batches(sentences)]
    if sentences:
        requests.append(("translate_nbest", list(sentences)))
    tf.io.gfile.makedirs(os.path.dirname(path))
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
