"""TF Serving's request formats fed to the exported signatures: REST bodies (row and
columnar, b64 bytes, options, n-best), a gRPC PredictRequest over the wire, and the
warmup requests written into the export."""

import base64
import json
import os

import numpy as np
import pytest
import tensorflow as tf
from saved_model_fixtures import SERVING_DIR, dev_sentences, serve_bytes

from tf_transformer.exporters import warmup
from tf_transformer.search import shape_buckets


# -- TF Serving request formats ------------------------------------------------------
def _json_value(value):
    if isinstance(value, dict) and set(value) == {"b64"}:
        return base64.b64decode(value["b64"])
    return value.encode() if isinstance(value, str) else value


def rest_inputs(body: dict, signature) -> dict:
    """A REST predict body -> input tensors, as TF Serving's json_tensor.cc decodes it.

    Row format: "instances" is a list of per-example values (single-input
    signatures) or of {input: value} objects; the examples are stacked.
    Columnar format: "inputs" is {input: batched value} (or one value for a
    single-input signature). Strings are UTF-8 text or {"b64": ...} bytes.
    """
    specs = signature.structured_input_signature[1]
    if "instances" in body:
        rows = body["instances"]
        if rows and isinstance(rows[0], dict) and set(rows[0]) != {"b64"}:
            columns = {name: [row[name] for row in rows] for name in specs}
        else:
            (name,) = specs
            columns = {name: rows}
    else:
        inputs = body["inputs"]
        columns = inputs if isinstance(inputs, dict) else {next(iter(specs)): inputs}
    assert set(columns) == set(specs), "TF Serving requires exactly the signature's inputs"
    tensors = {}
    for name, value in columns.items():
        value = [_json_value(v) for v in value] if isinstance(value, list) else _json_value(value)
        tensors[name] = tf.constant(value, specs[name].dtype)
    return tensors


def rest_response(outputs: dict, row_format: bool) -> dict:
    """Outputs -> the REST response body ("predictions" rows or "outputs" columns)."""
    def plain(array):
        if array.dtype == object:
            return np.vectorize(lambda b: b.decode("utf-8"), otypes=[object])(array).tolist()
        return array.tolist()

    columns = {k: plain(v.numpy()) for k, v in outputs.items()}
    if not row_format:
        return {"outputs": columns}
    size = len(next(iter(columns.values())))
    return {"predictions": [{k: v[i] for k, v in columns.items()} for i in range(size)]}


@pytest.mark.parametrize("request_file", [
    "request_row.json", "request_row_objects.json", "request_columnar.json",
    "request_options.json", "request_nbest.json", "request_binary.json"])
def test_rest_request_bodies_feed_the_signatures(loaded, translator, request_file):
    with open(os.path.join(SERVING_DIR, request_file)) as f:
        body = json.load(f)
    signature = loaded.signatures[body.get("signature_name", "serving_default")]
    inputs = rest_inputs(body, signature)
    outputs = signature(**inputs)
    response = json.loads(json.dumps(rest_response(outputs, "instances" in body)))
    texts = inputs["text"]
    alpha = float(inputs["alpha"]) if "alpha" in inputs else -1.0
    extra = int(inputs["extra_length"]) if "extra_length" in inputs else -1
    expected = [t.decode() for t in
                translator.translate(texts, alpha, extra)["translation"].numpy()]
    if "instances" in body:
        got = [row["translation"] for row in response["predictions"]]
    elif "translations" in response["outputs"]:
        got = [row[0] for row in response["outputs"]["translations"]]
    else:
        got = response["outputs"]["translation"]
    assert got == expected


def test_grpc_predict_request_round_trip(loaded):
    from tensorflow_serving.apis import predict_pb2

    texts = [b"Replacement table", b"bad \xff bytes", b""]
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "transformer"
    request.model_spec.signature_name = "serving_default"
    request.inputs["text"].CopyFrom(tf.make_tensor_proto(texts, dtype=tf.string))
    request = predict_pb2.PredictRequest.FromString(request.SerializeToString())  # the wire
    signature = loaded.signatures[request.model_spec.signature_name]
    outputs = signature(**{k: tf.constant(tf.make_ndarray(v)) for k, v in request.inputs.items()})
    response = predict_pb2.PredictResponse()
    response.model_spec.CopyFrom(request.model_spec)
    for name, tensor in outputs.items():
        response.outputs[name].CopyFrom(tf.make_tensor_proto(tensor.numpy()))
    response = predict_pb2.PredictResponse.FromString(response.SerializeToString())
    np.testing.assert_array_equal(tf.make_ndarray(response.outputs["translation"]),
                                  serve_bytes(loaded, texts))
    assert response.outputs["score"].dtype == tf.float32.as_datatype_enum
    assert tf.make_ndarray(response.outputs["translation"]).shape == (3,)


def test_warmup_requests_are_real_and_run(exported, loaded):
    requests = warmup.read_warmup_requests(os.path.join(exported, warmup.WARMUP_FILE))
    sentences = warmup.read_sentences(os.path.join(SERVING_DIR, "warmup_sentences.txt"))
    dev = set(dev_sentences(10 ** 6))
    assert len(sentences) >= 3 and all(s in dev for s in sentences)
    got = [(r.model_spec.signature_name, [t.decode() for t in r.inputs["text"].string_val])
           for r in requests]
    # Each sentence alone (shortest first), then one sentence per source-width bucket
    # (search/shape_buckets.py) repeated to each row bucket up to MAX_BATCH, then the
    # sentences for translate_nbest.
    assert got[:len(sentences)] == [("serving_default", [s]) for s in sorted(sentences, key=len)]
    assert got[-1] == ("translate_nbest", sentences)
    row_buckets = shape_buckets.row_buckets(warmup.MAX_BATCH)
    wide = [texts[0] for _, texts in got[len(sentences):-1:len(row_buckets)]]
    assert got[len(sentences):-1] == [("serving_default", [s] * rows) for s in wide
                                      for rows in row_buckets]
    with open(os.path.join(exported, "assets", "export_metadata.json"), encoding="utf-8") as f:
        max_width = json.load(f)["max_source_length"]
    widths = [loaded.signatures["tokenize"](text=tf.constant([s]))["source_ids"].shape[1]
              for s in wide]
    assert [int(shape_buckets.width(w, max_width)) for w in widths] == \
        shape_buckets.width_buckets(max_width), widths
    with open(os.path.join(exported, warmup.WARMUP_JSON), encoding="utf-8") as f:
        assert [(r["signature"], r["text"]) for r in json.load(f)] == got
    alone = {}
    for request in requests:
        assert request.model_spec.name == "transformer"
        signature = loaded.signatures[request.model_spec.signature_name]
        texts = tf.make_ndarray(request.inputs["text"])
        outputs = signature(text=tf.constant(texts))
        best = outputs.get("translation", outputs.get("translations"))
        best = best.numpy() if best.shape.rank == 1 else best.numpy()[:, 0]
        if len(texts) == 1:
            alone[texts[0]] = best[0]
        # A sentence's translation in any batch is its translation alone.
        assert list(best) == [alone[text] for text in texts]
