"""Tiny model directories for tests: config.json, vocab.model and a checkpoint.

`make_model_dir` follows the model-directory contract of model_dir.py, so
everything that reads a model_dir (Translator.from_model_dir, the translate and
evaluate binaries, export) can be tested against it in seconds. With
`steps > 0` the model is trained that many steps on short pairs of the embedded
corpus with the real Trainer; about 300 steps make it emit EOS at plausible
lengths (random weights almost never do, so every output would run to the
maximum length).
"""

from __future__ import annotations

import os

import tensorflow as tf

from tf_transformer.config import (
    Config,
    DataConfig,
    DecodeConfig,
    ModelConfig,
    TrainConfig,
)
from tf_transformer.decoding.translator import Translator
from tf_transformer.inputs import corpus, pipeline
from tf_transformer.inputs.tokenizer import Tokenizer
from tf_transformer.model_dir import ModelDir
from tf_transformer.training.trainer import Trainer

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EMBEDDED_CORPUS_DIR = os.path.join(REPO_ROOT, "data", "libreoffice-help.en-de")
TRAIN_TSV = os.path.join(EMBEDDED_CORPUS_DIR, "train.tsv")

# Source lines of the embedded corpus, for translation tests (distinct translations even from
# a barely trained model).
SAMPLE_LINES = [
    "Always checkbox",
    "If you want, you can override the default substitution font that your operating system "
    "uses when it encounters an unavailable font in a document.",
    "Fonts",
    "Enables the font replacement settings that you define.",
    "Replacement table",
    "Screen only",
    "Font replacement on screen and when printing, whether the font is installed or not.",
    "checked",
]
MAX_CHARS = 80  # short pairs only: a tiny model learns them (and EOS) quickly
NUM_PAIRS = 4000


def tiny_config(vocab_size: int, seed: int = 1, **model_overrides) -> Config:
    """2+2 layers, d_model 32, 4 heads; sources up to 64 tokens (EOS included)."""
    model = ModelConfig(**{"vocab_size": vocab_size, "num_layers": 2, "d_model": 32, "d_ff": 64,
                           "num_heads": 4, "dropout": 0.0, **model_overrides})
    data = DataConfig(max_length=64, tokens_per_batch=1024, shuffle_buffer=1000, seed=seed)
    train = TrainConfig(warmup_steps=100, learning_rate_scale=2.0, log_every=100,
                        checkpoint_minutes=1e9, seed=seed)
    return Config(model=model, data=data, train=train, decode=DecodeConfig(batch_size=8))


def make_model_dir(path: str, tokenizer_proto: bytes, steps: int = 0, seed: int = 1,
                   pairs: corpus.Corpus | None = None, **model_overrides) -> str:
    """Writes a tiny model directory at `path` and returns `path`.

    steps=0 saves the randomly initialised weights (seeded) as ckpt-0;
    otherwise the checkpoint is ckpt-<steps> of a short training run on `pairs`
    (default: NUM_PAIRS short pairs of the embedded corpus).
    `model_overrides` change ModelConfig fields (e.g. positions="learned").
    """
    vocab_size = Tokenizer(tokenizer_proto).vocab_size
    config = tiny_config(vocab_size, seed, **model_overrides)
    ModelDir(path).prepare(config, tokenizer_proto)
    trainer = Trainer(config, path, tf.distribute.OneDeviceStrategy("/cpu:0"))
    if steps == 0:
        trainer.save()
        return path
    if pairs is None:
        pairs = corpus.read_tsv(TRAIN_TSV, max_chars=MAX_CHARS)
        pairs = corpus.Corpus(pairs.sources[:NUM_PAIRS], pairs.targets[:NUM_PAIRS])
    tokenizer = Tokenizer(tokenizer_proto)

    def dataset_fn(start_step):
        del start_step  # a fresh shuffle is fine for a fixture
        return pipeline.dataset_fn(pairs, tokenizer, config.data, training=True)

    trainer.train(dataset_fn, max_steps=steps, log_fn=lambda line: None)
    return path


# Greedy decoding of a tiny model directory, outputs up to source + 5 tokens, one search per
# batch: the translate and evaluate binary tests and the evaluation tests decode with it.
GREEDY_DECODE = DecodeConfig(beam_size=1, extra_length=5, parallel_searches=1)
_TRANSLATORS: dict = {}


def shared_translator(model_dir: str, decode_config: DecodeConfig) -> Translator:
    """Translator.from_model_dir(model_dir, decode_config=decode_config), built once per
    (model_dir, decode_config) in this process: the test modules that decode a model
    directory with the same settings share its traced searches. Tests never change it."""
    key = (model_dir, decode_config)
    if key not in _TRANSLATORS:
        _TRANSLATORS[key] = Translator.from_model_dir(ModelDir(model_dir),
                                                      decode_config=decode_config)
    return _TRANSLATORS[key]
