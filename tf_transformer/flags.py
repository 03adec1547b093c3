"""The absl flags of the binaries, turned into one frozen Config.

Library code never reads flags: binaries call `config_from_flags()` and pass
the Config (or its parts) down.
"""

from __future__ import annotations

import dataclasses

from absl import flags

from tf_transformer import presets
from tf_transformer.config import Config, ModelConfig

FLAGS = flags.FLAGS

# Overrides of the preset, by config part; None keeps the preset's value.
_MODEL_OVERRIDES = {
    "num_layers": (int, "N: layers in the encoder and in the decoder."),
    "d_model": (int, "Model width."),
    "d_ff": (int, "Inner width of the feed-forward networks."),
    "num_heads": (int, "h: attention heads."),
    "d_k": (int, "Query/key width per head (default d_model/h)."),
    "d_v": (int, "Value width per head (default d_model/h)."),
    "dropout": (float, "P_drop: residual and embedding dropout."),
    "attention_dropout": (float, "Dropout on attention weights (not in the paper)."),
    "positions": (str, "sinusoid or learned."),
    "pre_norm": (bool, "Normalise before each sub-layer instead of after."),
}
_DATA_OVERRIDES = {
    "max_length": (int, "Longest pair side in tokens (EOS/BOS included); longer pairs are skipped."),
    "tokens_per_batch": (int, "Padded tokens of the longer side per batch, per replica."),
    "shuffle_buffer": (int, "Pairs in the shuffle buffer."),
    "deterministic": (bool, "Reproducible batch order (slower input)."),
}
_TRAIN_OVERRIDES = {
    "label_smoothing": (float, "epsilon_ls."),
    "warmup_steps": (int, "Linear warmup steps of the learning rate."),
    "learning_rate_scale": (float, "Multiplies the paper's learning-rate schedule."),
    "max_steps": (int, "Stop after this many optimizer steps (global)."),
    "accum_steps": (int, "Batches per replica accumulated into one optimizer step."),
    "dtype": (str, "float32, mixed_bfloat16 or mixed_float16 (with loss scaling)."),
    "jit_compile": (bool, "Compile the forward and backward pass with XLA."),
    "checkpoint_minutes": (float, "Minutes between checkpoints (paper: 10)."),
    "checkpoint_steps": (int, "Also checkpoint every this many steps (0: time only)."),
    "keep_checkpoints": (int, "Checkpoints kept in model_dir."),
    "average_last": (int, "Checkpoints averaged for the final model (paper: 5 base, 20 big)."),
    "log_every": (int, "Steps between progress lines and summaries."),
    "seed": (int, "Seed of weights, dropout and data order."),
}

_DEFINE = {int: flags.DEFINE_integer, float: flags.DEFINE_float, str: flags.DEFINE_string,
           bool: flags.DEFINE_bool}


def define_once(define, name: str, default, help_text: str) -> None:
    """Defines a flag unless a binary imported earlier into this process (tests) did."""
    if name not in FLAGS:
        define(name, default, help_text)


def define_model_dir_flags() -> None:
    define_once(flags.DEFINE_string, "model_dir", None,
                "Model directory (config.json, vocab.model, checkpoints).")
    define_once(flags.DEFINE_string, "checkpoint", None,
                "A checkpoint path or directory; default: the latest.")


def define_decode_flags() -> None:
    """Decoding settings; None keeps the model directory's config.json values."""
    define_once(flags.DEFINE_integer, "beam_size", None,
                "Beam size k (1: greedy); default from config.json.")
    define_once(flags.DEFINE_float, "alpha", None,
                "Length penalty exponent; default from config.json.")
    define_once(flags.DEFINE_integer, "extra_length", None,
                "Max output length = source length + this.")
    define_once(flags.DEFINE_integer, "nbest", None,
                "Hypotheses per input (<= beam_size).")
    define_once(flags.DEFINE_integer, "batch_size", None, "Sentences per batch.")
    define_once(flags.DEFINE_bool, "decode_jit_compile", None,
                "Compile the beam search with XLA (DecodeConfig.jit_compile).")


def decode_overrides() -> dict:
    """The decode flags the user set, as DecodeConfig fields."""
    names = {"beam_size": "beam_size", "alpha": "alpha", "extra_length": "extra_length",
             "nbest": "nbest", "batch_size": "batch_size", "decode_jit_compile": "jit_compile"}
    return {field: getattr(FLAGS, flag) for flag, field in names.items()
            if getattr(FLAGS, flag) is not None}


def define_model_flags() -> None:
    flags.DEFINE_string("preset", "tiny", "Preset (python -m tf_transformer.presets lists them).")
    for group in (_MODEL_OVERRIDES, _DATA_OVERRIDES, _TRAIN_OVERRIDES):
        for name, (kind, help_text) in group.items():
            _DEFINE[kind](name, None, help_text)


def config_from_flags(vocab_size: int | None = None) -> Config:
    """The preset, then every flag the user set, validated by the dataclasses."""
    config = presets.get_preset(FLAGS.preset, vocab_size)

    def overrides(group):
        return {name: getattr(FLAGS, name) for name in group if getattr(FLAGS, name) is not None}

    model_changes = overrides(_MODEL_OVERRIDES)
    if ("d_model" in model_changes or "num_heads" in model_changes) and config.model.d_k:
        # A preset's explicit d_k/d_v assume its d_model/h; recompute unless set.
        model_changes.setdefault("d_k", 0)
        model_changes.setdefault("d_v", 0)
    return Config(
        model=dataclasses.replace(config.model, **model_changes),
        data=dataclasses.replace(config.data, **overrides(_DATA_OVERRIDES)),
        train=dataclasses.replace(config.train, **overrides(_TRAIN_OVERRIDES)),
        decode=config.decode)


def with_vocab_size(config: Config, vocab_size: int) -> Config:
    return config.replace(model=dataclasses.replace(config.model, vocab_size=vocab_size))


__all__ = ["ModelConfig", "config_from_flags", "decode_overrides", "define_decode_flags",
           "define_model_dir_flags", "define_model_flags", "define_once", "with_vocab_size"]
