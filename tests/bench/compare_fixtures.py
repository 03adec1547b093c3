"""Shared by the harness tests (test_compare_*.py): bench/compare/opennmt_train.py
loaded on fake OpenNMT-tf modules (OpenNMT-tf lives in the harness's own venv, not ours)."""

import importlib.util
import os
import sys
import types


def fake_modules(*names: str) -> dict:
    """{name: an empty module} for each name."""
    return {name: types.ModuleType(name) for name in names}


def load_opennmt_train(monkeypatch, fakes: dict):
    """opennmt_train.py executed with `fakes` ({name: module}) in sys.modules."""
    from bench.compare import trainings

    for name, module in fakes.items():
        monkeypatch.setitem(sys.modules, name, module)
    spec = importlib.util.spec_from_file_location(
        "opennmt_train", os.path.join(trainings.HERE, "opennmt_train.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
