"""Fixtures of the training tests."""

import os

import pytest
from model_fixtures import EMBEDDED_CORPUS_DIR


@pytest.fixture(scope="module")
def train_tsv(tmp_path_factory):
    """The first 300 pairs of the embedded train split (the training-binary tests)."""
    path = tmp_path_factory.mktemp("data") / "train.tsv"
    with open(os.path.join(EMBEDDED_CORPUS_DIR, "train.tsv"), encoding="utf-8") as f:
        lines = [next(f) for _ in range(300)]
    path.write_text("".join(lines), encoding="utf-8")
    return str(path)
