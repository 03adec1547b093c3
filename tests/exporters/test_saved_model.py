"""The export binary's SavedModel: layout, signatures, outputs equal to the in-process
Translator, TF Serving's session loader, bad input, large batches and threads.

The fixtures (tests/exporters/conftest.py) export the EOS-prone tiny model once
per session; saved_model_fixtures.py says how it is made. Request formats are in
test_serving_requests.py, versions and checkpoints in test_export_versions.py,
clean processes in test_export_processes.py.
"""

import json
import os
import threading

import numpy as np
import pytest
import tensorflow as tf
from saved_model_fixtures import SIGNATURE_SPECS, dev_sentences, serve_bytes

from tf_transformer.config import EOS_ID
from tf_transformer.exporters import saved_model, warmup
from tf_transformer import model_dir as model_dir_lib


# -- layout, assets, signatures -------------------------------------------------
def test_layout_metadata_and_assets(exported, model_dir):
    export_dir = os.path.dirname(exported)
    assert os.path.basename(exported) == "1"
    assert sorted(os.listdir(export_dir)) == [".last_version", "1"]  # no temporary left
    for name in ("saved_model.pb", "variables/variables.index", "assets/vocab.model",
                 "assets/export_metadata.json", warmup.WARMUP_FILE):
        assert os.path.exists(os.path.join(exported, name)), name
    with open(os.path.join(model_dir, model_dir_lib.VOCAB_FILE), "rb") as f:
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
                              "jit_compile": False, "length_bucket": None, "dtype": "float32",
                              "bounded_shapes": True}  # the export's default
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


def _search_loops(export):
    """{function name: its While ops} of the functions of `export` that hold a loop."""
    from tensorflow.core.protobuf import saved_model_pb2
    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(export, "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    loops = {f.signature.name: sum(node.op in ("While", "StatelessWhile") for node in f.node_def)
             for f in proto.meta_graphs[0].graph_def.library.function}
    return {name: count for name, count in loops.items() if count}


def test_each_search_is_traced_once(exported, bf16_exported):
    """Signatures, the module's functions and the parts of a batch share one trace of the
    search per nbest: a second copy (signatures traced before the save's own retrace) cost
    ~90 MB of loader RSS, a copy per parallel search ~60 MB. (`exported` runs one search
    per batch; `bf16_exported` has the parallel parts and serving_default alone, whose
    search is the only one it holds.)"""
    loops = _search_loops(exported)
    # nbest 1 (translate) and nbest = beam (translate_nbest, translate_ids: the
    # export's), the sampling loop (sample), the search with alignments
    # (translate_with_alignments) and the prefixed search (translate_with_prefix)
    assert sorted(loops.values()) == [1, 1, 1, 1, 1], loops
    assert list(_search_loops(bf16_exported).values()) == [1]


def test_chosen_signatures_alone_are_exported(bf16_exported):
    """`export --signatures=serving_default` (conftest.py's bf16_exported): that signature
    alone in the MetaGraphDef and the metadata; unknown names are refused, serving_default
    is always among the chosen, in the table's order."""
    from tensorflow.core.protobuf import saved_model_pb2
    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(bf16_exported, "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    names = {n for n in proto.meta_graphs[0].signature_def if not n.startswith("__")}
    assert names == {"serving_default"}
    with open(os.path.join(bf16_exported, "assets", "export_metadata.json")) as f:
        assert json.load(f)["signatures"] == ["serving_default"]
    assert saved_model.chosen_signatures(None) == saved_model.SIGNATURES
    assert saved_model.chosen_signatures(["tokenize", "sample"]) == (
        "serving_default", "tokenize", "sample")
    with pytest.raises(ValueError, match=r"unknown signatures \['translate_fast'\]"):
        saved_model.chosen_signatures(["translate_fast", "tokenize"])


def test_outputs_equal_the_translator_and_options_work(loaded, translator):
    texts = dev_sentences(6)
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
    texts = dev_sentences(3)
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as session:
        meta_graph = tf.compat.v1.saved_model.loader.load(session, ["serve"], exported)
        signature = meta_graph.signature_def["serving_default"]
        out = session.run({k: v.name for k, v in signature.outputs.items()},
                          {signature.inputs["text"].name: texts})
    np.testing.assert_array_equal(out["translation"], serve_bytes(loaded, texts))


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
    expected = translator.translate(tf.constant(texts))  # the in-process path, same weights
    np.testing.assert_array_equal(out["translation"].numpy(), expected["translation"].numpy())
    np.testing.assert_array_equal(out["length"].numpy(), expected["length"].numpy())
    ids = loaded.signatures["tokenize"](text=tf.constant([long_line]))["source_ids"].numpy()
    assert ids.shape == (1, 64) and ids[0, -1] == EOS_ID
    # Each input alone gives what it gives in the batch.
    for i, text in enumerate(texts):
        assert serve_bytes(loaded, [text])[0] == out["translation"].numpy()[i]
    empty = loaded.signatures["serving_default"](text=tf.constant([], tf.string))
    assert empty["translation"].shape == [0] and empty["score"].shape == [0]
    nbest = loaded.signatures["translate_nbest"](text=tf.constant([], tf.string))
    assert nbest["translations"].shape == [0, 2]


def test_a_batch_of_1000(loaded):
    pool = dev_sentences(20) + ["", "  "]
    texts = [pool[i % len(pool)] for i in range(1000)]
    got = serve_bytes(loaded, texts)
    assert got.shape == (1000,)
    alone = dict(zip(pool, serve_bytes(loaded, pool)))
    assert [alone[t] for t in texts] == list(got)


def test_eight_threads_get_what_serial_calls_get(loaded):
    batches = [dev_sentences(3, start=3 * i) for i in range(8)]
    serial = [serve_bytes(loaded, b) for b in batches]
    results, errors = [None] * 8, []

    def work(i):
        try:
            results[i] = [serve_bytes(loaded, batches[i]) for _ in range(3)]
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
