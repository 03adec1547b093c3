"""Test set-up: quiet TensorFlow, XLA's back end at -O0, and the CPU split into logical devices.

Two logical CPU devices let MirroredStrategy run real multi-replica training
in tests on a machine without GPUs; it must happen before TensorFlow
initialises its devices, hence at import time here. The tests run with the
binaries' process defaults (process_defaults.py), set before TensorFlow's import.

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

from tf_transformer import process_defaults  # noqa: E402

process_defaults.apply()

from tf_transformer.training import distribution  # noqa: E402

TEST_CPU_DEVICES = 2
distribution.split_cpu(TEST_CPU_DEVICES)

from model_fixtures import EMBEDDED_CORPUS_DIR, REPO_ROOT  # noqa: E402,F401


# --- Corpus and tokenizers shared by the data tests (tf_transformer/inputs/corpus.py, tokenizer.py).
import pytest  # noqa: E402



@pytest.fixture(scope="session")
def embedded_corpus():
    """The embedded train split (20000 pairs), never ../shared."""
    from tf_transformer.inputs import corpus
    return corpus.read_tsv(os.path.join(EMBEDDED_CORPUS_DIR, "train.tsv"))


@pytest.fixture(scope="session")
def spm_model_path(tmp_path_factory, embedded_corpus):
    """A small BPE vocabulary (500 pieces, first 2000 pairs): for fast model tests. Without
    byte fallback, as older vocabularies (500 pieces keep their merges; the search's default
    path); `byte_fallback_model_path` is the default kind."""
    from tf_transformer.inputs import corpus, tokenizer
    subset = corpus.Corpus(embedded_corpus.sources[:2000], embedded_corpus.targets[:2000])
    path = str(tmp_path_factory.mktemp("spm") / "small.model")
    tokenizer.train_sentencepiece(subset, 500, path, byte_fallback=False)
    return path


@pytest.fixture(scope="session")
def byte_fallback_model_path(tmp_path_factory, embedded_corpus):
    """The default kind: 600 BPE pieces with byte fallback (256 of them bytes), first 2000
    pairs."""
    from tf_transformer.inputs import corpus, tokenizer
    subset = corpus.Corpus(embedded_corpus.sources[:2000], embedded_corpus.targets[:2000])
    path = str(tmp_path_factory.mktemp("spm") / "bytes.model")
    tokenizer.train_sentencepiece(subset, 600, path)
    return path


@pytest.fixture(scope="session")
def small_tokenizer(spm_model_path):
    from tf_transformer.inputs import tokenizer
    return tokenizer.Tokenizer(spm_model_path)


@pytest.fixture(scope="session")
def tokenizer_8k(tmp_path_factory, embedded_corpus):
    """The demo's kind of vocabulary: 8000 BPE pieces with byte fallback on the whole
    embedded train split (~1 s)."""
    from tf_transformer.inputs import tokenizer
    path = str(tmp_path_factory.mktemp("spm") / "spm8k.model")
    tokenizer.train_sentencepiece(embedded_corpus, 8000, path)
    return tokenizer.Tokenizer(path)


# --- A tiny model directory (tests/model_fixtures.py) for translation and export tests.
@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, spm_model_path):
    """config.json + vocab.model (500 pieces) + ckpt-0 of seeded random weights (2+2 layers,
    d_model 32); `model_fixtures.make_model_dir` makes variants (trained, learned positions)."""
    from model_fixtures import make_model_dir
    with open(spm_model_path, "rb") as f:
        proto = f.read()
    return make_model_dir(str(tmp_path_factory.mktemp("model") / "tiny"), proto, steps=0, seed=1)


# --- The order in which `make test`'s workers take the files (--dist loadfile).
# Each worker takes the next file when it finishes one, in collection order
# (--no-loadscope-reorder), so the longest go first and the workers end together;
# collected last, one of them ran alone for its last 1.5 minutes. The longest files of
# the suite's runs (bench/results/tests.md), longest first; the rest keep their order.
LONGEST_FILES_FIRST = (
    "test_recipes.py",
    "test_gpu_path_workers.py",
    "test_train_binary.py",
    "test_bfloat16_export.py",
    "test_saved_model.py",
    "test_trainer_compiled.py",
    "test_ctranslate2.py",
    "test_unseen_characters.py",
    "test_export_processes.py",
    "test_translator.py",
    "test_multi_worker.py",
    "test_host_loop.py",
    "test_trainer.py",
    "test_fine_tuning.py",
    "test_separate_vocabularies.py",
)


def pytest_collection_modifyitems(items):
    def rank(item):
        name = item.path.name
        return LONGEST_FILES_FIRST.index(name) if name in LONGEST_FILES_FIRST else len(
            LONGEST_FILES_FIRST)
    items.sort(key=rank)  # stable: within a file, and among the rest, the collected order
