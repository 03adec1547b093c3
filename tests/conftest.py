"""Test set-up: quiet TensorFlow, XLA's back end at -O0, and the CPU split into logical devices.

Two logical CPU devices let MirroredStrategy run real multi-replica training
in tests on a machine without GPUs; it must happen before TensorFlow
initialises its devices, hence in pytest_configure, before the test modules are
imported. The tests run with the binaries' process defaults (process_defaults.py), set
before TensorFlow's import. xdist's controller (`make test`'s -n), which runs no test,
never imports TensorFlow: the lines TensorFlow logs at its import would be held in the
controller's captured stderr and printed after the summary.

XLA compiles with LLVM's code generation at -O0 here (XLA_FLAGS, which the binaries
the tests start inherit): tests compile many small programs and run each a few
times, and at the default level LLVM's optimisation is a large part of each
compilation on CPU. What XLA builds and optimises (the HLO: fusion, layouts, constant folding),
hence what the tests compare with the graph path, is the same; only the machine
code is less optimised. An XLA_FLAGS that sets the level itself is left alone.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = " ".join(
        [os.environ.get("XLA_FLAGS", ""), "--xla_backend_optimization_level=0"]).strip()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pytest  # noqa: E402
from run_cache_fixtures import built_once  # noqa: E402

TEST_CPU_DEVICES = 2


def pytest_configure(config):
    if config.getoption("dist", "no") != "no" and not hasattr(config, "workerinput"):
        return  # xdist's controller: the workers run the tests
    from tf_transformer import process_defaults
    process_defaults.apply()
    from tf_transformer.training import distribution
    distribution.split_cpu(TEST_CPU_DEVICES)


# --- Corpus and tokenizers shared by the data tests (tf_transformer/inputs/corpus.py, tokenizer.py).
@pytest.fixture(scope="session")
def embedded_corpus():
    """The embedded train split (20000 pairs), never ../shared."""
    from model_fixtures import EMBEDDED_CORPUS_DIR
    from tf_transformer.inputs import corpus
    return corpus.read_tsv(os.path.join(EMBEDDED_CORPUS_DIR, "train.tsv"))


def _sentencepiece(embedded_corpus, vocab_size, byte_fallback=True, pairs=2000):
    """A builder of a BPE vocabulary of the first `pairs` embedded pairs (built_once)."""
    from tf_transformer.inputs import corpus, tokenizer
    subset = corpus.Corpus(embedded_corpus.sources[:pairs], embedded_corpus.targets[:pairs])
    return lambda path: tokenizer.train_sentencepiece(subset, vocab_size, path,
                                                      byte_fallback=byte_fallback)


@pytest.fixture(scope="session")
def spm_model_path(tmp_path_factory, worker_id, embedded_corpus):
    """A small BPE vocabulary (500 pieces, first 2000 pairs): for fast model tests. Without
    byte fallback, as older vocabularies (500 pieces keep their merges; the search's default
    path); `byte_fallback_model_path` is the default kind. Built once per run."""
    return built_once(tmp_path_factory, worker_id, "spm-bpe500-2000pairs.model",
                      _sentencepiece(embedded_corpus, 500, byte_fallback=False))


@pytest.fixture(scope="session")
def byte_fallback_model_path(tmp_path_factory, worker_id, embedded_corpus):
    """The default kind: 600 BPE pieces with byte fallback (256 of them bytes), first 2000
    pairs. Built once per run."""
    return built_once(tmp_path_factory, worker_id, "spm-bpe600-bytes-2000pairs.model",
                      _sentencepiece(embedded_corpus, 600))


@pytest.fixture(scope="session")
def small_tokenizer(spm_model_path):
    from tf_transformer.inputs import tokenizer
    return tokenizer.Tokenizer(spm_model_path)


@pytest.fixture(scope="session")
def tokenizer_8k(tmp_path_factory, worker_id, embedded_corpus):
    """The demo's kind of vocabulary: 8000 BPE pieces with byte fallback on the whole
    embedded train split. Built once per run."""
    from tf_transformer.inputs import tokenizer
    path = built_once(tmp_path_factory, worker_id, "spm-bpe8000-bytes-train.model",
                      _sentencepiece(embedded_corpus, 8000, pairs=len(embedded_corpus.sources)))
    return tokenizer.Tokenizer(path)


# --- A tiny model directory (tests/model_fixtures.py) for translation and export tests.
@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, worker_id, spm_model_path):
    """config.json + vocab.model (500 pieces) + ckpt-0 of seeded random weights (2+2 layers,
    d_model 32); `model_fixtures.make_model_dir` makes variants (trained, learned positions).
    Built once per run: tests read it, never write into it."""
    from model_fixtures import make_model_dir
    with open(spm_model_path, "rb") as f:
        proto = f.read()
    return built_once(tmp_path_factory, worker_id, "tiny-2+2-seed1",
                      lambda path: make_model_dir(path, proto, steps=0, seed=1))


@pytest.fixture(scope="session")
def trained_tiny_model_dir(tmp_path_factory, worker_id, spm_model_path):
    """The tiny model with 1+1 layers after 120 steps on the embedded pairs: it emits EOS at
    varied lengths (int8 and CTranslate2 tests). Built once per run."""
    from model_fixtures import make_model_dir
    with open(spm_model_path, "rb") as f:
        proto = f.read()
    return built_once(tmp_path_factory, worker_id, "tiny-1+1-trained120",
                      lambda path: make_model_dir(path, proto, steps=120, num_layers=1))
