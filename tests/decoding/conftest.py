"""The EOS-prone tiny model (decoding_fixtures.py) shared by the scoring, sampling and
alignment tests, with a greedy and a beam-4 Translator: each traces its searches once."""

import pytest
from decoding_fixtures import load_model, translator


@pytest.fixture(scope="session")
def eos_prone_model(tiny_model_dir):
    return load_model(tiny_model_dir, eos_scale=4.0)


@pytest.fixture(scope="session")
def greedy(eos_prone_model, tiny_model_dir):
    """Beam 1 over the EOS-prone model, outputs up to source + 20 tokens."""
    return translator(eos_prone_model, tiny_model_dir, beam_size=1, extra_length=20,
                      parallel_searches=1)


@pytest.fixture(scope="session")
def beam4(eos_prone_model, tiny_model_dir):
    """Beam 4, nbest 2 over the EOS-prone model, outputs up to source + 20 tokens."""
    return translator(eos_prone_model, tiny_model_dir, beam_size=4, nbest=2, extra_length=20,
                      parallel_searches=1)
