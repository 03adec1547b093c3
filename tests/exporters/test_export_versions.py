"""Export versions (claimed atomically, never reused) and the checkpoints an export
reads (--checkpoint, --average_last, refused together)."""

import os
import shutil
import types

import numpy as np
import pytest
from binary_fixtures import run_main
from saved_model_fixtures import DECODE

from tf_transformer.config import DecodeConfig
from tf_transformer.decoding.translator import Translator
from tf_transformer.exporters import saved_model, versions
from tf_transformer.model_dir import ModelDir


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
                                 max_source_length=8, max_target_length=8, dtype="float32",
                                 model_search=types.SimpleNamespace(bounded_shapes=False))
    with pytest.raises(RuntimeError):
        saved_model.export(fake, base, str(vocab), {})
    assert not [n for n in os.listdir(base) if n.startswith(".tmp-5")]  # cleaned up
    assert versions.claim_version(base)[0] == 6


def test_average_last_averages_in_memory(model_dir):
    translator = Translator.from_model_dir(ModelDir(model_dir), decode_config=DECODE,
                                           average_last=2)
    paths = list(translator.checkpoint_paths)
    assert [os.path.basename(p) for p in paths] == ["ckpt-1", "ckpt-2"]
    table = translator.model.target_embedding.token_embedding.embeddings.numpy()
    one = Translator.from_model_dir(ModelDir(model_dir), paths[0], DECODE)
    two = Translator.from_model_dir(ModelDir(model_dir), decode_config=DECODE)
    mean = (one.model.target_embedding.token_embedding.embeddings.numpy().astype(np.float64)
            + two.model.target_embedding.token_embedding.embeddings.numpy()) / 2
    np.testing.assert_allclose(table, mean, rtol=1e-6)
    with pytest.raises(ValueError):
        Translator.from_model_dir(ModelDir(model_dir), decode_config=DECODE, average_last=3)
    assert DecodeConfig().with_overrides({"beam_size": 3}, all_beams=True).nbest == 3


def test_export_flags_are_checked(model_dir, tmp_path):
    refused = run_main("export", [f"--model_dir={model_dir}", f"--export_dir={tmp_path / 'e'}",
                                  "--average_last=2", f"--checkpoint={model_dir}"])
    assert refused["code"] == 1  # app.UsageError
    assert "give --checkpoint or --average_last, not both" in refused["stderr"]
    unknown = run_main("export", [f"--model_dir={model_dir}", f"--export_dir={tmp_path / 'e'}",
                                  "--signatures=translate,translate_fast"])
    assert unknown["code"] == 1 and "--signatures: unknown signatures ['translate_fast']" in \
        unknown["stderr"]
    assert not os.path.exists(tmp_path / "e")
    chosen = Translator.from_model_dir(ModelDir(model_dir), f"{model_dir}/ckpt-1", DECODE)
    paths = list(chosen.checkpoint_paths)
    assert paths == [f"{model_dir}/ckpt-1"]
    table = chosen.model.target_embedding.token_embedding.embeddings.numpy()
    latest = Translator.from_model_dir(ModelDir(model_dir), decode_config=DECODE)
    latest_table = latest.model.target_embedding.token_embedding.embeddings.numpy()
    assert not np.array_equal(table, latest_table)
