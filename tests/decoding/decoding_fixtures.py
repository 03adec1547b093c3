"""Translators over the tiny random-weight model for the scoring, sampling and alignment tests.

Random weights almost never emit EOS, so `eos_prone` scales up the EOS row of the
shared embedding (as test_translator.py does): hypotheses then end by EOS at
varied lengths. The search and the model code are untouched.
"""

import tensorflow as tf

from tf_transformer import model_dir as model_dir_lib
from tf_transformer.config import EOS_ID, DecodeConfig
from tf_transformer.decoding.translator import Translator
from tf_transformer.inputs.tokenizer import Tokenizer
from tf_transformer.model.transformer import build_model
from tf_transformer.model_dir import ModelDir

SENTENCES = [
    "Fonts",
    "Replacement table",
    "Enables the font replacement settings that you define.",
    "If you want, you can override the default substitution font that your operating system "
    "uses when it encounters an unavailable font in a document.",
    "Always checkbox",
    "Screen only",
    "Font replacement on screen and when printing, whether the font is installed or not.",
    "checked",
]


def load_model(model_dir, eos_scale=1.0):
    config = ModelDir(model_dir).read_config()
    model = build_model(config.model)
    tf.train.Checkpoint(model=model).restore(tf.train.latest_checkpoint(model_dir)).expect_partial()
    if eos_scale != 1.0:
        table = model.target_embedding.token_embedding.embeddings
        table.assign(tf.tensor_scatter_nd_update(table, [[EOS_ID]],
                                                 table[EOS_ID:EOS_ID + 1] * eos_scale))
    return model


def translator(model, model_dir, decode_step=None, **decode):
    """A Translator over `model` with DecodeConfig(**decode), sources up to 64 tokens."""
    tokenizer = Tokenizer(f"{model_dir}/{model_dir_lib.VOCAB_FILE}")
    return Translator(model, tokenizer, DecodeConfig(**decode), max_source_length=64,
                      decode_step=decode_step)
