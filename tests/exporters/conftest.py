"""One SavedModel export shared by the export tests (built once per run, run_cache_fixtures)."""

import os

import pytest
import tensorflow as tf
from run_cache_fixtures import built_once
from saved_model_fixtures import DECODE, DECODE_FLAGS, export_model, make_model_dir

from tf_transformer.decoding.translator import Translator
from tf_transformer.exporters import versions
from tf_transformer.model_dir import ModelDir


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory, worker_id, spm_model_path):
    return built_once(tmp_path_factory, worker_id, "export-model-eos",
                      lambda path: make_model_dir(path, spm_model_path))


@pytest.fixture(scope="session")
def exported(model_dir, tmp_path_factory, worker_id):
    """The export of `model_dir` (DECODE_FLAGS, --average_last=2): its version directory."""
    export_dir = built_once(
        tmp_path_factory, worker_id, "export-transformer-average2",
        lambda path: export_model(model_dir, path, *DECODE_FLAGS, "--average_last=2"))
    return os.path.join(export_dir, str(versions._last_issued(export_dir)))


@pytest.fixture(scope="session")
def loaded(exported):
    return tf.saved_model.load(exported)


@pytest.fixture(scope="session")
def bf16_exported(model_dir, tmp_path_factory, worker_id):
    """The --dtype=bfloat16 export of `model_dir` (--average_last=2) with the default
    parallel searches (--parallel_searches=2: a batch of 16 or more sentences is searched
    as two sub-batches), no warmup requests, serving_default alone (--signatures): its
    version directory."""
    flags = [f for f in DECODE_FLAGS if not f.startswith("--parallel_searches")]
    export_dir = built_once(
        tmp_path_factory, worker_id, "export-transformer-average2-bfloat16-parallel",
        lambda path: export_model(model_dir, path, *flags, "--parallel_searches=2",
                                  "--average_last=2", "--dtype=bfloat16", "--warmup_sentences=",
                                  "--signatures=serving_default"))
    return os.path.join(export_dir, str(versions._last_issued(export_dir)))


@pytest.fixture(scope="session")
def translator(model_dir):
    """The in-process path with the exported weights (the mean of ckpt-1 and ckpt-2)."""
    return Translator.from_model_dir(ModelDir(model_dir), decode_config=DECODE, average_last=2)
