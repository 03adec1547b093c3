"""--dtype=bfloat16: the Translator and its SavedModel hold bfloat16 weights and run
their products in bfloat16, while scores, the search's arithmetic and tokenization stay
as they are; a clean process serves the export with tensorflow and tensorflow_text only,
and the XLA-compiled bfloat16 export (--decode_jit_compile) in a process that imports
tensorflow_text."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf
from saved_model_fixtures import (
    DECODE,
    DECODE_FLAGS,
    clean_and_translator_outputs,
    clean_translate,
    dev_sentences,
    export_model,
    serve_bytes,
)

from tf_transformer.cli.batching import translate_sentences
from tf_transformer.decoding.translator import Translator
from tf_transformer.exporters import saved_model
from tf_transformer.model_dir import ModelDir

BF16 = DECODE.with_overrides({"dtype": "bfloat16"})


@pytest.fixture(scope="module")
def bf16_translator(model_dir):
    return Translator.from_model_dir(ModelDir(model_dir), decode_config=BF16, average_last=2)


def test_weights_are_the_float32_ones_rounded_to_bfloat16(bf16_translator, translator):
    assert {str(v.dtype) for v in bf16_translator.model.weights} == {"bfloat16"}
    assert bf16_translator.model.compute_dtype == "bfloat16"
    for ours, full in zip(bf16_translator.model.weights, translator.model.weights):
        assert ours.path == full.path
        np.testing.assert_array_equal(ours.numpy(), tf.cast(full, tf.bfloat16).numpy())


def test_scores_are_float32_and_outputs_follow_the_float32_search(bf16_translator, translator):
    texts = dev_sentences(40, start=60)
    ours = translate_sentences(bf16_translator, texts, batch_size=8)
    full = translate_sentences(translator, texts, batch_size=8)
    out = bf16_translator.translate(tf.constant(texts[:2]))
    assert out["score"].dtype == tf.float32 and out["length"].dtype == tf.int32
    same = [a.texts[0] == b.texts[0] for a, b in zip(ours, full)]
    assert sum(same) >= 0.75 * len(texts), sum(same)
    for a, b, equal in zip(ours, full, same):
        if equal:  # the same hypothesis, scored through bfloat16 products
            assert abs(a.scores[0] - b.scores[0]) <= 0.02 * abs(b.scores[0]) + 0.05


def test_a_step_runs_every_product_on_onednn(bf16_translator):
    """Eigen's bfloat16 products do not use the CPU's matrix units: a bfloat16 step's
    products are MatMul and BatchMatMulV2 (oneDNN's), none BatchMatMulV3."""
    model, search = bf16_translator.model, bf16_translator.model_search
    source = tf.constant([[5, 6, 7, 3]])
    cache = model.initial_cache(model.encode(source), source)
    step = tf.function(lambda ids, s: search.step_fn()(ids, s, cache)[0], autograph=False)
    graph = step.get_concrete_function(tf.TensorSpec([1, 4], tf.int32),
                                       tf.TensorSpec([], tf.int32)).graph
    types = {op.type for op in graph.get_operations()}
    assert {"MatMul", "BatchMatMulV2"} <= types and "BatchMatMulV3" not in types


def test_a_step_attends_over_a_memory_padded_to_16_positions(bf16_translator):
    """oneDNN builds and keeps a kernel per product shape: sources of 2 to 16 tokens
    give the step's cross attention one memory width; a search with alignments keeps
    the source's own width."""
    search = bf16_translator.model_search
    widths = {search.initial_cache(tf.constant([[5] * n + [3]]), 4).memory_keys[0].shape[2]
              for n in range(1, 16)}
    assert widths == {16}
    aligned = search.initial_cache(tf.constant([[5, 6, 3]]), 4, aligned=True)
    assert aligned.memory_keys[0].shape[2] == aligned.memory_bias.shape[-1] == 3


@pytest.mark.slow
def test_export_holds_bfloat16_variables_and_serves_in_a_clean_process(
        bf16_exported, bf16_translator, translator, tmp_path):
    reader = tf.train.load_checkpoint(os.path.join(bf16_exported, "variables", "variables"))
    dtypes = {name: dtype for name, dtype in reader.get_variable_to_dtype_map().items()
              if not name.startswith("_CHECKPOINTABLE_OBJECT_GRAPH")}
    assert dtypes and set(dtypes.values()) == {tf.bfloat16}
    folder = os.path.join(bf16_exported, "variables")
    stored = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
    float32_bytes = sum(w.numpy().nbytes for w in translator.model.weights)
    assert stored < 0.6 * float32_bytes  # two bytes a weight (the float32 export: four)
    with open(os.path.join(bf16_exported, "assets", saved_model.METADATA_FILE)) as f:
        assert json.load(f)["decode"]["dtype"] == "bfloat16"
    # One batch of 21: the export's two parallel searches (conftest.py's bf16_exported),
    # against one search per batch of 8 in bf16_translator.
    texts = dev_sentences(20, start=300) + [""]
    got, expected = clean_and_translator_outputs(bf16_exported, bf16_translator, texts,
                                                 str(tmp_path), serve_batch=32)
    assert got == expected


@pytest.fixture(scope="module")
def compiled_run(model_dir, tmp_path_factory):
    """The bfloat16 --decode_jit_compile export (the XLA search inside the SavedModel) served
    by a clean process that imports tensorflow_text, refusing keras_hub, keras_nlp and this
    repository (test_export_processes.py serves the default export with --ops=libraries):
    (export, lines, output lines, status). One batch: XLA compiles each batch and length
    shape once."""
    work = tmp_path_factory.mktemp("xla")
    compiled = export_model(model_dir, str(work / "export"), *DECODE_FLAGS, "--average_last=2",
                            "--dtype=bfloat16", "--decode_jit_compile", "--warmup_sentences=",
                            "--signatures=serving_default")
    texts = dev_sentences(20, start=40) + [""]
    got, status = clean_translate(compiled, ("\n".join(texts) + "\n").encode(), str(work),
                                  "--ops=tensorflow_text",
                                  "--refuse=keras_hub,keras_nlp,tf_transformer", "--batch_size=32")
    return compiled, texts, got, status


@pytest.mark.slow
def test_clean_process_with_tensorflow_text_imported_serves_the_compiled_export(compiled_run):
    compiled, texts, got, status = compiled_run
    assert status["refused_imports"] == []  # keras is imported, by tensorflow_text itself
    assert not [m for m in status["loaded_modules"] if not m.startswith("keras")]
    assert got == [t.decode() for t in serve_bytes(tf.saved_model.load(compiled), texts)]


@pytest.mark.slow
def test_jit_compiled_bfloat16_export_translates(compiled_run, bf16_translator):
    """Against the bfloat16 graph search (the clean-process test above checks that the
    non-compiled export serves what bf16_translator translates)."""
    compiled, texts, got, _ = compiled_run
    with open(os.path.join(compiled, "assets", saved_model.METADATA_FILE)) as f:
        decode = json.load(f)["decode"]
    assert decode["jit_compile"] and decode["length_bucket"] == 16
    assert decode["dtype"] == "bfloat16"
    assert len(set(got)) > 10 and got[-1] == ""
    want = bf16_translator.translate(tf.constant(texts[:-1]))["translation"].numpy()
    assert sum(a == b.decode() for a, b in zip(got, want)) >= 0.75 * len(want)
