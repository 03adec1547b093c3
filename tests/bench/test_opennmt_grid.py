"""bench/compare/opennmt_grid.py's files for one setting: OpenNMT-tf's model with the grid's
dropouts over the protocol's model, and a run configuration with its label smoothing, dev
evaluation, early stopping on BLEU and checkpoint averaging."""

import json
import sys
import types

from bench.compare import opennmt_grid


def test_a_setting_writes_its_model_and_run_configuration(tmp_path, monkeypatch):
    d = {"data": str(tmp_path), "dev_en": "dev.en", "dev_de": "dev.de", "onmt_vocab": "vocab"}
    args = opennmt_grid.onmt_args(d, str(tmp_path / "d03_ls02"), opennmt_grid.GRID["d03_ls02"])
    model_file, run_yml = args[1], args[4]
    with open(run_yml) as f:
        run = json.load(f)
    assert run["params"]["label_smoothing"] == 0.2
    assert run["eval"]["early_stopping"] == {"metric": "bleu", "min_improvement": 0.01,
                                             "steps": opennmt_grid.EARLY_STOP}
    assert run["eval"]["scorers"] == "bleu" and run["eval"]["steps"] == opennmt_grid.EVAL_STEPS
    assert run["train"]["average_last_checkpoints"] == opennmt_grid.AVERAGE_LAST
    assert run["data"]["eval_features_file"] == "dev.en" and run["model_dir"].endswith("d03_ls02")
    built = {}
    monkeypatch.setitem(sys.modules, "opennmt_model", types.SimpleNamespace(
        model=lambda **dropouts: built.update(dropouts) or "model"))
    namespace = {}
    with open(model_file) as f:
        exec(f.read(), namespace)  # as onmt-main loads a --model file
    assert namespace["model"]() == "model"
    assert built == {"dropout": 0.3, "attention_dropout": 0.1, "ffn_dropout": 0.1}
