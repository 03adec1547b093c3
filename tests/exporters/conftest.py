"""One SavedModel export shared by the export tests (built once per session)."""

import pytest
import tensorflow as tf
from saved_model_fixtures import DECODE, DECODE_FLAGS, export_model, make_model_dir

from tf_transformer.decoding.translator import Translator
from tf_transformer.model_dir import ModelDir


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory, spm_model_path):
    return make_model_dir(str(tmp_path_factory.mktemp("export_model") / "eos"), spm_model_path)


@pytest.fixture(scope="session")
def exported(model_dir, tmp_path_factory):
    return export_model(model_dir, str(tmp_path_factory.mktemp("exports") / "transformer"),
                        *DECODE_FLAGS, "--average_last=2")


@pytest.fixture(scope="session")
def loaded(exported):
    return tf.saved_model.load(exported)


@pytest.fixture(scope="session")
def translator(model_dir):
    """The in-process path with the exported weights (the mean of ckpt-1 and ckpt-2)."""
    return Translator.from_model_dir(ModelDir(model_dir), decode_config=DECODE, average_last=2)
