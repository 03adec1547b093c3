"""The export binary and its SavedModel: signatures, serving formats, bad input, clean load.

The model is the tiny random-weight fixture with its EOS embedding row scaled
up (as in test_translator.py), so hypotheses end at varied lengths; ckpt-1 and
ckpt-2 differ only in that scale, for --checkpoint and --average_last.
Everything runs on one export (module fixture); the subprocess tests are slow.
"""

import base64
import json
import os
import shutil
import subprocess
import sys
import threading
import types

import numpy as np
import pytest
import tensorflow as tf
from absl import flags

from export import __main__ as export_main
from tf_transformer.config import EOS_ID, Config, DecodeConfig
from tf_transformer.exporters import saved_model, versions, warmup
from tf_transformer.model import build_model
from tf_transformer.training import checkpoints

FLAGS = flags.FLAGS
from model_fixtures import REPO_ROOT  # noqa: E402

SERVING_DIR = os.path.join(REPO_ROOT, "export", "serving")
PYTHON = sys.executable
DECODE_FLAGS = ["--beam_size=2", "--extra_length=6"]
DECODE = DecodeConfig(beam_size=2, extra_length=6, nbest=2)
SIGNATURE_SPECS = {  # name -> (inputs, outputs): {name: (dtype, shape)}
    "serving_default": ({"text": (tf.string, [None])},
                        {"translation": (tf.string, [None]), "score": (tf.float32, [None])}),
    "translate": ({"text": (tf.string, [None]), "alpha": (tf.float32, []),
                   "extra_length": (tf.int32, [])},
                  {"translation": (tf.string, [None]), "score": (tf.float32, [None]),
                   "length": (tf.int32, [None])}),
    "translate_nbest": ({"text": (tf.string, [None])},
                        {"translations": (tf.string, [None, 2]), "scores": (tf.float32, [None, 2]),
                         "lengths": (tf.int32, [None, 2])}),
    "translate_ids": ({"source_ids": (tf.int32, [None, None])},
                      {"ids": (tf.int32, [None, 2, None]), "scores": (tf.float32, [None, 2]),
                       "lengths": (tf.int32, [None, 2])}),
    "tokenize": ({"text": (tf.string, [None])}, {"source_ids": (tf.int32, [None, None])}),
    "detokenize": ({"ids": (tf.int32, [None, None])}, {"text": (tf.string, [None])}),
}


def _dev_sentences(n, start=0):
    return warmup.read_sentences(
        os.path.join(REPO_ROOT, "data", "libreoffice-help.en-de", "dev.tsv"))[start:start + n]


def _save_eos_scaled(model_dir, source_dir, scales):
    config = Config.load(source_dir)
    model = build_model(config.model)
    latest = tf.train.latest_checkpoint(source_dir)
    tf.train.Checkpoint(model=model).restore(latest).expect_partial()
    table = model.target_embedding.token_embedding.embeddings
    original = tf.identity(table)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), model_dir, max_to_keep=5)
    for number, scale in enumerate(scales, start=1):
        table.assign(tf.tensor_scatter_nd_update(original, [[EOS_ID]],
                                                 original[EOS_ID:EOS_ID + 1] * scale))
        manager.save(checkpoint_number=number)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tiny_model_dir):
    path = str(tmp_path_factory.mktemp("export_model") / "eos")
    os.makedirs(path)
    for name in ("config.json", checkpoints.VOCAB_FILE):
        shutil.copy(os.path.join(tiny_model_dir, name), path)
    _save_eos_scaled(path, tiny_model_dir, scales=[4.5, 4.0])  # latest: ckpt-2, scale 4
    return path


def _export(model_dir, export_dir, *args):
    FLAGS.unparse_flags()
    FLAGS(["export", f"--model_dir={model_dir}", f"--export_dir={export_dir}", *args])
    export_main.main([])
    return os.path.join(export_dir, str(versions._last_issued(export_dir)))


@pytest.fixture(scope="module")
def exported(model_dir, tmp_path_factory):
    return _export(model_dir, str(tmp_path_factory.mktemp("exports") / "transformer"),
                   *DECODE_FLAGS, "--average_last=2")


@pytest.fixture(scope="module")
def loaded(exported):
    return tf.saved_model.load(exported)


@pytest.fixture(scope="module")
def translator(model_dir):
    """The in-process path with the exported weights (the mean of ckpt-1 and ckpt-2)."""
    return saved_model.load_translator(model_dir, DECODE, average_last=2)[0]


def _serve(loaded, texts):
    out = loaded.signatures["serving_default"](text=tf.constant(texts, tf.string))
    return [t.decode() for t in out["translation"].numpy()], out["score"].numpy()


# -- layout, assets, signatures -------------------------------------------------
def test_layout_metadata_and_assets(exported, model_dir):
    export_dir = os.path.dirname(exported)
    assert os.path.basename(exported) == "1"
    assert sorted(os.listdir(export_dir)) == [".last_version", "1"]  # no temporary left
    for name in ("saved_model.pb", "variables/variables.index", "assets/vocab.model",
                 "assets/export_metadata.json", warmup.WARMUP_FILE):
        assert os.path.exists(os.path.join(exported, name)), name
    with open(os.path.join(model_dir, checkpoints.VOCAB_FILE), "rb") as f:
        vocab = f.read()
    with open(os.path.join(exported, "assets", "vocab.model"), "rb") as f:
        assert f.read() == vocab
    # The graph's SentencepieceOp carries the model as an attribute: the same bytes.
    embedded = saved_model.embedded_sentencepiece_models(exported)
    assert embedded and all(m == vocab for m in embedded)
    with open(os.path.join(exported, "assets", "export_metadata.json")) as f:
        meta = json.load(f)
    assert meta["checkpoints"] == [os.path.join(model_dir, f"ckpt-{n}") for n in (1, 2)]
    assert meta["averaged"] == 2
    assert meta["decode"] == {"beam_size": 2, "nbest": 2, "alpha": 0.6, "extra_length": 6,
                              "jit_compile": False, "length_bucket": None}
    assert meta["config"]["model"]["d_model"] == 32 and meta["max_source_length"] == 64
    assert meta["version"] == 1 and set(meta["signatures"]) == set(SIGNATURE_SPECS)


def test_signatures_names_dtypes_and_shapes(loaded):
    assert set(loaded.signatures) == set(SIGNATURE_SPECS)
    for name, (inputs, outputs) in SIGNATURE_SPECS.items():
        signature = loaded.signatures[name]
        specs = signature.structured_input_signature[1]
        assert {k: (s.dtype, s.shape.as_list()) for k, s in specs.items()} == inputs, name
        got = {k: (s.dtype, s.shape.as_list()) for k, s in signature.structured_outputs.items()}
        assert got == outputs, name


def test_outputs_equal_the_translator_and_options_work(loaded, translator):
    texts = _dev_sentences(6)
    expected = translator.translate(tf.constant(texts))
    got = loaded.signatures["serving_default"](text=tf.constant(texts))
    np.testing.assert_array_equal(got["translation"].numpy(), expected["translation"].numpy())
    np.testing.assert_allclose(got["score"].numpy(), expected["score"].numpy(), rtol=1e-6)
    assert len(set(translator.translate(tf.constant(texts))["length"].numpy())) > 1  # EOS works
    # Options: as a signature input (negative: the baked-in value), or as optional Python args.
    options = loaded.signatures["translate"](text=tf.constant(texts), alpha=tf.constant(-1.0),
                                             extra_length=tf.constant(-1))
    np.testing.assert_array_equal(options["translation"].numpy(), expected["translation"].numpy())
    shorter = loaded.translate(tf.constant(texts), extra_length=2)
    assert shorter["length"].numpy().max() <= max(
        len(ids) for ids in translator.tokenizer.tokenize(tf.constant(texts)).to_list()) + 1 + 2
    np.testing.assert_array_equal(
        shorter["translation"].numpy(),
        translator.translate(tf.constant(texts), extra_length=2)["translation"].numpy())
    nbest = loaded.signatures["translate_nbest"](text=tf.constant(texts))
    assert nbest["translations"].shape == [6, 2]
    np.testing.assert_array_equal(nbest["translations"].numpy()[:, 0],
                                  expected["translation"].numpy())
    # The token-id path: tokenize -> translate_ids -> detokenize gives the same text.
    ids = loaded.signatures["tokenize"](text=tf.constant(texts))["source_ids"]
    result = loaded.signatures["translate_ids"](source_ids=ids)
    text = loaded.signatures["detokenize"](ids=result["ids"][:, 0])["text"]
    np.testing.assert_array_equal(text.numpy(), nbest["translations"].numpy()[:, 0])


def test_session_loader_as_tf_serving_uses_it(exported, loaded):
    """TF Serving loads with a session (restore op + signature tensors), not tf.saved_model.load."""
    texts = _dev_sentences(3)
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as session:
        meta_graph = tf.compat.v1.saved_model.loader.load(session, ["serve"], exported)
        signature = meta_graph.signature_def["serving_default"]
        out = session.run({k: v.name for k, v in signature.outputs.items()},
                          {signature.inputs["text"].name: texts})
    np.testing.assert_array_equal(out["translation"], _serve_bytes(loaded, texts))


def _serve_bytes(loaded, texts):
    return loaded.signatures["serving_default"](text=tf.constant(texts))["translation"].numpy()


# -- bad input and load ------------------------------------------------------------
def test_bad_inputs_give_one_output_each_in_order(loaded, translator):
    long_line = " ".join(["word"] * 5000)
    texts = [b"", b"   ", b"bad \xff\xfe bytes \xc3", long_line.encode(), b"Fonts", b"\t\n"]
    out = loaded.signatures["translate"](text=tf.constant(texts), alpha=tf.constant(-1.0),
                                         extra_length=tf.constant(-1))
    assert out["translation"].shape == [6]
    assert list(out["translation"].numpy()[[0, 1, 5]]) == [b"", b"", b""]
    assert list(out["score"].numpy()[[0, 1, 5]]) == [0.0, 0.0, 0.0]
    assert all(out["translation"].numpy()[[2, 3, 4]])
    assert out["length"].numpy()[3] <= 64 + 6  # truncated to max_source_length (64, EOS incl.)
    ids = loaded.signatures["tokenize"](text=tf.constant([long_line]))["source_ids"].numpy()
    assert ids.shape == (1, 64) and ids[0, -1] == EOS_ID
    # Each input alone gives what it gives in the batch.
    for i, text in enumerate(texts):
        assert _serve_bytes(loaded, [text])[0] == out["translation"].numpy()[i]
    empty = loaded.signatures["serving_default"](text=tf.constant([], tf.string))
    assert empty["translation"].shape == [0] and empty["score"].shape == [0]
    nbest = loaded.signatures["translate_nbest"](text=tf.constant([], tf.string))
    assert nbest["translations"].shape == [0, 2]


def test_a_batch_of_1000(loaded):
    pool = _dev_sentences(20) + ["", "  "]
    texts = [pool[i % len(pool)] for i in range(1000)]
    got = _serve_bytes(loaded, texts)
    assert got.shape == (1000,)
    alone = dict(zip(pool, _serve_bytes(loaded, pool)))
    assert [alone[t] for t in texts] == list(got)


def test_eight_threads_get_what_serial_calls_get(loaded):
    batches = [_dev_sentences(3, start=3 * i) for i in range(8)]
    serial = [_serve_bytes(loaded, b) for b in batches]
    results, errors = [None] * 8, []

    def work(i):
        try:
            results[i] = [_serve_bytes(loaded, batches[i]) for _ in range(3)]
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i in range(8):
        for got in results[i]:
            np.testing.assert_array_equal(got, serial[i])


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
                                  _serve_bytes(loaded, texts))
    assert response.outputs["score"].dtype == tf.float32.as_datatype_enum
    assert tf.make_ndarray(response.outputs["translation"]).shape == (3,)


def test_warmup_requests_are_real_and_run(exported, loaded):
    requests = warmup.read_warmup_requests(os.path.join(exported, warmup.WARMUP_FILE))
    sentences = warmup.read_sentences(os.path.join(SERVING_DIR, "warmup_sentences.txt"))
    dev = set(_dev_sentences(10 ** 6))
    assert len(sentences) >= 3 and all(s in dev for s in sentences)
    sizes = [len(r.inputs["text"].string_val) for r in requests]
    assert sizes.count(1) == len(sentences) and max(sizes) == len(sentences)
    for request in requests:
        assert request.model_spec.name == "transformer"
        signature = loaded.signatures[request.model_spec.signature_name]
        outputs = signature(text=tf.constant(tf.make_ndarray(request.inputs["text"])))
        assert next(iter(outputs.values())).shape[0] == len(request.inputs["text"].string_val)


# -- versions, checkpoints ------------------------------------------------------------
def test_versions_are_claimed_atomically_and_never_reused(tmp_path, monkeypatch):
    base = str(tmp_path / "exports")
    assert versions.claim_version(base)[0] == 1
    os.rename(os.path.join(base, ".tmp-1"), os.path.join(base, "1"))
    assert versions.claim_version(base) == (2, os.path.join(base, ".tmp-2"))  # tmp-2 claimed
    assert versions.claim_version(base)[0] == 3  # another exporter, concurrently
    shutil.rmtree(os.path.join(base, ".tmp-2"))
    shutil.rmtree(os.path.join(base, ".tmp-3"))
    shutil.rmtree(os.path.join(base, "1"))
    assert versions.claim_version(base)[0] == 4  # deleted numbers are not handed out again

    def fail(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(saved_model, "ServingModule", fail)
    vocab = tmp_path / "vocab.model"
    vocab.write_bytes(b"x")
    fake = types.SimpleNamespace(beam_size=1, nbest=1, alpha=0.6, extra_length=5, jit_compile=False,
                                 max_source_length=8, max_target_length=8)
    with pytest.raises(RuntimeError):
        saved_model.export(fake, base, str(vocab), {})
    assert not [n for n in os.listdir(base) if n.startswith(".tmp-5")]  # cleaned up
    assert versions.claim_version(base)[0] == 6


def test_average_last_averages_in_memory(model_dir):
    translator, paths = saved_model.load_translator(model_dir, DECODE, average_last=2)
    assert [os.path.basename(p) for p in paths] == ["ckpt-1", "ckpt-2"]
    table = translator.model.target_embedding.token_embedding.embeddings.numpy()
    one, _ = saved_model.load_translator(model_dir, DECODE, checkpoint=paths[0])
    two, _ = saved_model.load_translator(model_dir, DECODE)
    mean = (one.model.target_embedding.token_embedding.embeddings.numpy().astype(np.float64)
            + two.model.target_embedding.token_embedding.embeddings.numpy()) / 2
    np.testing.assert_allclose(table, mean, rtol=1e-6)
    with pytest.raises(ValueError):
        saved_model.load_translator(model_dir, DECODE, average_last=3)
    assert DecodeConfig().with_overrides({"beam_size": 3}, all_beams=True).nbest == 3


def test_export_flags_are_checked(model_dir, tmp_path):
    from absl import app
    with pytest.raises(app.UsageError):
        _export(model_dir, str(tmp_path / "e"), "--average_last=2", f"--checkpoint={model_dir}")
    assert not os.path.exists(tmp_path / "e")
    chosen, paths = saved_model.load_translator(model_dir, DECODE, checkpoint=f"{model_dir}/ckpt-1")
    assert paths == [f"{model_dir}/ckpt-1"]
    table = chosen.model.target_embedding.token_embedding.embeddings.numpy()
    latest, _ = saved_model.load_translator(model_dir, DECODE)
    latest_table = latest.model.target_embedding.token_embedding.embeddings.numpy()
    assert not np.array_equal(table, latest_table)


# -- clean processes -----------------------------------------------------------------
def _env():
    # The translate binary turns oneDNN on (tf_transformer/__init__.py); so does the server here.
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "1"}


def _clean_translate(exported, lines: bytes, cwd, *args):
    run = subprocess.run(
        [PYTHON, "-I", os.path.join(SERVING_DIR, "translate_saved_model.py"),
         f"--saved_model={exported}", *args],
        input=lines, capture_output=True, cwd=cwd, env=_env(), timeout=300)
    assert run.returncode == 0, run.stderr.decode()[-3000:]
    return run.stdout.decode().split("\n")[:-1], json.loads(run.stderr.decode().splitlines()[-1])


@pytest.mark.slow
def test_clean_process_output_equals_the_translate_binary(exported, model_dir, tmp_path):
    lines = _dev_sentences(40, start=100) + ["", "   "] + _dev_sentences(10, start=500)
    data = ("\n".join(lines) + "\n").encode()
    got, status = _clean_translate(exported, data, str(tmp_path), "--ops=libraries",
                                   "--refuse=all", "--batch_size=16")
    # Nothing of keras / keras_hub / keras_nlp / this repository was imported or importable.
    assert status["loaded_modules"] == [] and status["lines"] == len(lines)
    # Only tensorflow/__init__.py tries (keras.src.optimizers, its ImportError ignored).
    assert all("/tensorflow/__init__.py:" in r["importer"] for r in status["refused_imports"])
    assert REPO_ROOT not in status["sys_path"] and "" not in status["sys_path"]
    source = tmp_path / "input.txt"
    source.write_bytes(data)
    averaged = str(tmp_path / "averaged")  # the same float64 mean, as a model directory
    checkpoints.write_averaged(model_dir, 2, averaged, build_model)
    binary = subprocess.run(
        [PYTHON, "-m", "tf_transformer.translate", f"--model_dir={averaged}",
         f"--input={source}", *DECODE_FLAGS],
        capture_output=True, cwd=REPO_ROOT, env=_env(), timeout=300)
    assert binary.returncode == 0, binary.stderr.decode()[-3000:]
    expected = binary.stdout.decode().split("\n")[:-1]
    assert len(expected) == len(lines) and got == expected
    assert len(set(got)) > 10 and got[40:42] == ["", ""]


@pytest.mark.slow
def test_clean_process_with_tensorflow_text_imported(exported, loaded, tmp_path):
    texts = _dev_sentences(4)
    got, status = _clean_translate(exported, ("\n".join(texts) + "\n").encode(), str(tmp_path),
                                   "--ops=tensorflow_text",
                                   "--refuse=keras_hub,keras_nlp,tf_transformer")
    assert got == [t.decode() for t in _serve_bytes(loaded, texts)]
    assert status["refused_imports"] == []  # keras is imported, by tensorflow_text itself
    assert not [m for m in status["loaded_modules"] if not m.startswith("keras")]


@pytest.mark.slow
def test_jit_compiled_export_translates_as_the_default_one(model_dir, loaded, tmp_path):
    """--decode_jit_compile: the XLA search inside the SavedModel, in a clean process."""
    compiled = _export(model_dir, str(tmp_path / "xla"), *DECODE_FLAGS, "--average_last=2",
                       "--decode_jit_compile", "--warmup_sentences=")
    with open(os.path.join(compiled, "assets", saved_model.METADATA_FILE)) as f:
        decode = json.load(f)["decode"]
    assert decode["jit_compile"] and decode["length_bucket"] == 16
    texts = _dev_sentences(20, start=40) + [""]
    got, _ = _clean_translate(compiled, ("\n".join(texts) + "\n").encode(), str(tmp_path),
                              "--ops=libraries", "--batch_size=8")
    assert got == [t.decode() for t in _serve_bytes(loaded, texts)]


@pytest.mark.slow
def test_saved_model_cli_show_and_run(exported, loaded):
    cli = os.path.join(os.path.dirname(PYTHON), "saved_model_cli")
    show = subprocess.run([cli, "show", "--dir", exported, "--all"], capture_output=True,
                          env=_env(), timeout=300)
    assert show.returncode == 0, show.stderr.decode()[-2000:]
    text = show.stdout.decode()
    for name in SIGNATURE_SPECS:
        assert f"signature_def['{name}']" in text
    assert "inputs['text'] tensor_info:\n        dtype: DT_STRING\n        shape: (-1)" in text
    assert "'SentencepieceOp'" in text
    run_args = ["run", "--dir", exported, "--tag_set", "serve", "--signature_def",
                "serving_default", "--input_exprs", 'text=["Replacement table","Fonts"]']
    plain = subprocess.run([cli, *run_args], capture_output=True, env=_env(), timeout=300)
    # The stock CLI does not import tensorflow_text, so the ops are unknown to it.
    assert plain.returncode != 0
    assert "Op type not registered 'SentencepieceOp'" in plain.stderr.decode()
    wrapped = subprocess.run(
        [PYTHON, "-c", "import sys, tensorflow_text; from tensorflow.python.tools import "
         "saved_model_cli; sys.argv[0] = 'saved_model_cli'; sys.exit(saved_model_cli.main())",
         *run_args], capture_output=True, env=_env(), timeout=300)
    assert wrapped.returncode == 0, wrapped.stderr.decode()[-2000:]
    expected = _serve_bytes(loaded, ["Replacement table", "Fonts"])
    assert "Result for output key translation:" in wrapped.stdout.decode()
    assert repr(expected[0])[:30] in wrapped.stdout.decode()
