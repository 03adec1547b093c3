"""--dtype=int8 export: the int8 weights travel as constants of the graph beside the
bfloat16 variables, and the export serves with tensorflow and tensorflow_text only (a
clean process, the C client), translating as the in-process int8 Translator does."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import tensorflow as tf
from model_fixtures import REPO_ROOT
from saved_model_fixtures import (
    DECODE,
    DECODE_FLAGS,
    clean_and_translator_outputs,
    dev_sentences,
    export_model,
    serve_bytes,
    serving_env,
)
from tensorflow.core.protobuf import saved_model_pb2

from tf_transformer.decoding.translator import Translator
from tf_transformer.exporters import saved_model
from tf_transformer.model_dir import ModelDir

INT8 = DECODE.with_overrides({"dtype": "int8"})
CLIENT_DIR = os.path.join(REPO_ROOT, "export", "serving", "c_client")


@pytest.fixture(scope="module")
def int8_exported(model_dir, tmp_path_factory):
    return export_model(model_dir, str(tmp_path_factory.mktemp("int8")), *DECODE_FLAGS,
                        "--average_last=2", "--dtype=int8", "--warmup_sentences=")


@pytest.fixture(scope="module")
def int8_translator(model_dir):
    return Translator.from_model_dir(ModelDir(model_dir), decode_config=INT8, average_last=2)


def _graph_nodes(exported):
    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(exported, "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    graph = proto.meta_graphs[0].graph_def
    return list(graph.node) + [n for f in graph.library.function for n in f.node_def]


@pytest.mark.slow
def test_export_holds_int8_constants_beside_bfloat16_variables(int8_exported, translator):
    reader = tf.train.load_checkpoint(os.path.join(int8_exported, "variables", "variables"))
    dtypes = {dtype for name, dtype in reader.get_variable_to_dtype_map().items()
              if not name.startswith("_CHECKPOINTABLE_OBJECT_GRAPH")}
    assert dtypes == {tf.bfloat16}
    nodes = _graph_nodes(int8_exported)
    int8_constants = [n for n in nodes if n.op == "Const" and n.attr["dtype"].type == tf.int8]
    model = translator.model
    stored = sum(len(n.attr["value"].tensor.tensor_content) for n in int8_constants)
    assert stored == model.vocab_size * model.d_model  # the output table once, a byte a weight
    # The output layer's quantized matmul in every search loop (nbest 1 and 2, alignments,
    # sampling, prefixes), all reading that one constant.
    assert sum(n.op == "_QuantizedMatMul" for n in nodes) >= 2
    with open(os.path.join(int8_exported, "assets", saved_model.METADATA_FILE)) as f:
        assert json.load(f)["decode"]["dtype"] == "int8"


@pytest.mark.slow
def test_int8_export_serves_in_a_clean_process_as_the_translator(
        int8_exported, int8_translator, tmp_path):
    texts = dev_sentences(12, start=300) + [""]
    got, expected = clean_and_translator_outputs(int8_exported, int8_translator, texts,
                                                 str(tmp_path), serve_batch=8)
    assert got == expected


@pytest.mark.slow
def test_every_signature_runs_after_reload(int8_exported):
    loaded = tf.saved_model.load(int8_exported)
    texts = dev_sentences(3, start=40)
    best = serve_bytes(loaded, texts)
    text = tf.constant(texts)
    ids = loaded.signatures["tokenize"](text=text)["source_ids"]
    out = loaded.signatures["translate_ids"](source_ids=ids)
    detokenized = loaded.signatures["detokenize"](ids=out["ids"][:, 0])["text"].numpy()
    assert list(detokenized) == list(best)
    aligned = loaded.signatures["translate_with_alignments"](text=text)
    assert list(aligned["translation"].numpy()) == list(best)
    scored = loaded.signatures["score"](source=text, target=tf.constant(best))
    assert scored["log_prob"].numpy().max() < 0
    sampled = loaded.signatures["sample"](
        text=text, sampling_topk=tf.constant(1), sampling_topp=tf.constant(0.0),
        sampling_temperature=tf.constant(0.0), seed=tf.constant(1, tf.int64))
    assert sampled["translation"].shape == [3]


@pytest.mark.slow
def test_the_c_client_serves_the_int8_export(int8_exported):
    """The client only calls the signature: it serves the int8 export unchanged."""
    if not shutil.which("gcc") or not shutil.which("make"):
        pytest.skip("gcc or make is not installed: the C client cannot be built")
    make = ["make", "-s", "-C", CLIENT_DIR, f"PY={sys.executable}"]
    if subprocess.run(make, capture_output=True, timeout=600).returncode:
        pytest.skip("the C client does not build here (test_c_client.py reports why)")
    library = subprocess.run(make + ["ops-library"], capture_output=True, text=True,
                             timeout=120).stdout.strip()
    texts = dev_sentences(4, start=60)
    run = subprocess.run([os.path.join(CLIENT_DIR, "translate"),
                          f"--saved_model={int8_exported}", f"--ops_library={library}"],
                         input=("\n".join(texts) + "\n").encode(), capture_output=True,
                         env=serving_env(), timeout=300)
    assert run.returncode == 0, run.stderr.decode()[-3000:]
    want = serve_bytes(tf.saved_model.load(int8_exported), texts)
    assert run.stdout.split(b"\n")[:-1] == list(want)
