"""The absl flags of the binaries, turned into one frozen Config.

Library code never reads flags: binaries call `config_from_flags()` or
`translator_from_flags()` and pass the results down. The flags defined here
are shared by several binaries; each binary calls
`flags.adopt_module_key_flags(tf_transformer.flags)` so that its --help lists
them (absl lists only the main module's key flags). A binary defines each group
once: binaries run in separate processes and never import each other.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from absl import app, flags

from tf_transformer import presets, process_defaults
from tf_transformer.config import DECODE_DTYPES, Config, DecodeConfig, ModelConfig

if TYPE_CHECKING:  # TensorFlow only once a binary runs (fast --help)
    from tf_transformer.decoding.translator import Translator
    from tf_transformer.model_dir import ModelDir

FLAGS = flags.FLAGS

# Overrides of the preset, by config part; None keeps the preset's value.
_MODEL_OVERRIDES = {
    "num_layers": (int, "N: layers in the encoder and in the decoder."),
    "d_model": (int, "Model width."),
    "d_ff": (int, "Inner width of the feed-forward networks."),
    "num_heads": (int, "h: attention heads."),
    "d_k": (int, "Query/key width per head (0: d_model/h)."),
    "d_v": (int, "Value width per head (0: d_model/h)."),
    "dropout": (float, "P_drop: residual and embedding dropout."),
    "attention_dropout": (float, "Dropout on attention weights (not in the paper)."),
    "relu_dropout": (float, "Dropout inside the feed-forward network, after the ReLU "
                            "(not in the paper)."),
    "positions": (str, "sinusoid or learned."),
    "pre_norm": (bool, "Normalise before each sub-layer instead of after."),
}
_DATA_OVERRIDES = {
    "max_length": (int, "Longest pair side in tokens (EOS/BOS included); longer pairs are skipped."),
    "tokens_per_batch": (int, "Padded tokens of the longer side per batch, per replica."),
    "shuffle_buffer": (int, "Pairs in the shuffle buffer."),
    "deterministic": (bool, "Reproducible batch order (slower input)."),
    "static_batch": (bool, "Training batches in a few fixed shapes, short ones filled with PAD rows."),
    "packing": (bool, "Pack several pairs per fixed-length row (segment ids; one static shape)."),
    "subword_sampling": (float, "BPE-dropout of the training pairs: each merge skipped with this "
                                "probability, seeded by (seed, pass, line) (0: off)."),
}
_TRAIN_OVERRIDES = {
    "label_smoothing": (float, "epsilon_ls."),
    "rdrop_alpha": (float, "R-Drop: each batch twice through the model with independent "
                           "dropout, plus this times the symmetric KL of the two outputs "
                           "(paper: 5; 0: off, one pass)."),
    "warmup_steps": (int, "Linear warmup steps of the learning rate."),
    "learning_rate_scale": (float, "Multiplies the paper's learning-rate schedule."),
    "max_steps": (int, "Stop after this many optimizer steps (global)."),
    "accum_steps": (int, "Batches per replica accumulated into one optimizer step."),
    "dtype": (str, "float32, mixed_bfloat16, mixed_float16 (with loss scaling), or auto: "
                   "mixed_bfloat16 on a GPU or a CPU with bfloat16 matrix units (amx_bf16), "
                   "else float32."),
    "jit_compile": (bool, "Compile the forward and backward pass with XLA (one trace for "
                          "every replica, one compilation per batch shape)."),
    "compile_step": (bool, "Compile the whole step (with Adam) with XLA, once per batch shape; "
                           "one replica. Pair with --static_batch."),
    "steps_per_call": (int, "Optimizer steps per tf.function call: the host queues N steps "
                            "at once (logging, evaluation and checkpoints end a call)."),
    "checkpoint_minutes": (float, "Minutes between checkpoints (paper: 10)."),
    "checkpoint_steps": (int, "Also checkpoint every this many steps (0: time only)."),
    "keep_checkpoints": (int, "Checkpoints kept in model_dir."),
    "average_last": (int, "Checkpoints averaged for the final model (paper: 5 base, 20 big)."),
    "keep_best": (int, ("Checkpoints kept in model_dir/best/ by dev BLEU (dev loss without "
                        "--dev_bleu_sentences); needs --dev_data (0: none).")),
    "early_stop": (int, "Stop after this many dev evaluations without improvement (0: never)."),
    "divergence_steps": (int, ("Warn when the loss stays flat at the unigram model's level "
                               "after warmup for this many steps (0: no check).")),
    "log_every": (int, "Steps between progress lines and summaries."),
    "seed": (int, "Seed of weights, dropout and data order."),
}

# Train flags whose binary default is not the preset's: the training dtype is the one this
# machine's matrix units pay for (training/precision.py), whatever the preset.
BINARY_DEFAULTS = {"dtype": "auto"}
_DEFINE = {int: flags.DEFINE_integer, float: flags.DEFINE_float, str: flags.DEFINE_string,
           bool: flags.DEFINE_bool}
_DECODE_FLAGS = {  # flag -> DecodeConfig field; None defaults keep config.json's value
    "beam_size": "beam_size", "alpha": "alpha", "extra_length": "extra_length",
    "nbest": "nbest", "batch_size": "batch_size", "decode_jit_compile": "jit_compile",
    "parallel_searches": "parallel_searches", "dtype": "dtype", "bounded_shapes": "bounded_shapes"}


def define_model_dir_flags() -> None:
    flags.DEFINE_string("model_dir", None,
                        "Model directory (config.json, vocab.model, checkpoints); required.")


def define_restore_flags() -> None:
    """--model_dir and which of its checkpoints to load (model_dir.load_model)."""
    define_model_dir_flags()
    flags.DEFINE_string("checkpoint", None,
                        "A checkpoint path or directory, or 'best' (the best by dev score, "
                        "from --model_dir/best/); default: the latest of --model_dir.")
    flags.DEFINE_integer("average_last", 0,
                         "Average the last N checkpoints of --model_dir in memory; with "
                         "--checkpoint=best the N best (0: do not).", lower_bound=0)


def define_decode_flags(nbest_help: str | None, batch_size: bool = True,
                        dtype: bool = True, search: bool = True) -> None:
    """Decoding settings (section 6.1), by default the model directory's config.json ones;
    --nbest only with its binary's `nbest_help`, --batch_size only with `batch_size`,
    --dtype (the Translator's) only with `dtype` (not beside the training --dtype), the
    search's own (--beam_size, --extra_length, --decode_jit_compile,
    --parallel_searches, --bounded_shapes) only with `search` (scoring has no search)."""
    if search:
        flags.DEFINE_integer("beam_size", None, "Beam size k (1: greedy); default: config.json's.")
    flags.DEFINE_float("alpha", None, "Length penalty exponent; default: config.json's.")
    if search:
        flags.DEFINE_integer("extra_length", None,
                             "Max output length = source length + this; default: config.json's.")
    if nbest_help:
        flags.DEFINE_integer("nbest", None, nbest_help)
    if batch_size:
        flags.DEFINE_integer("batch_size", None, "Sentences per batch; default: config.json's.")
    if search:
        flags.DEFINE_bool("decode_jit_compile", None,
                          "Compile the beam search with XLA; default: config.json's (off).")
        flags.DEFINE_integer("parallel_searches", None,
                             "Graph mode: search a batch of at least 8 sentences per search as "
                             "this many sub-batches side by side; default: config.json's (2).")
        flags.DEFINE_bool("bounded_shapes", None,
                          "Graph mode: pad batches, sources and working rows to a fixed set of "
                          "shapes (search/shape_buckets.py), for servers; default: config.json's "
                          "(off), on in an export.")
    if dtype:
        flags.DEFINE_enum("dtype", None, list(DECODE_DTYPES),
                          "Weights and matrix products of the search: float32, bfloat16 "
                          "(fast on CPUs with bfloat16 matrix units, AMX; scores stay float32), "
                          "or int8 (bfloat16, the decoding step's projections and output layer "
                          "int8 through oneDNN's quantized matmul; no --decode_jit_compile); "
                          "default: config.json's (float32).")


def decode_overrides() -> dict:
    """The decode flags the user set, as DecodeConfig fields. Beside the model flags
    (define_decode_flags without `dtype`), --dtype is training's and is not one of them."""
    overrides = {field: FLAGS[flag].value for flag, field in _DECODE_FLAGS.items()
                 if flag in FLAGS and FLAGS[flag].value is not None}
    if overrides.get("dtype") not in (None, *DECODE_DTYPES):
        del overrides["dtype"]
    return overrides


def define_corpus_binary_flags(data_help: str, search: bool = True) -> None:
    """The flags of a binary that runs a trained model over the pairs of --data (evaluate,
    score): the restore flags, the decode flags (no --nbest) and --data."""
    define_restore_flags()
    define_decode_flags(nbest_help=None, search=search)
    flags.DEFINE_string("data", None, data_help)


def translator_for_corpus() -> tuple[Translator, DecodeConfig]:
    """UsageError without --data, else translator_from_flags()."""
    if not FLAGS.data:
        raise app.UsageError("--data is required")
    return translator_from_flags()


def check_restore_flags() -> None:
    """UsageError unless --model_dir is set and --average_last comes with no --checkpoint
    or with --checkpoint=best."""
    if not FLAGS.model_dir:
        raise app.UsageError("--model_dir is required")
    if FLAGS.checkpoint and FLAGS.checkpoint != "best" and FLAGS.average_last:
        raise app.UsageError("give --checkpoint or --average_last, not both "
                             "(--checkpoint=best --average_last=N averages the N best)")


def translator_from_flags(all_beams: bool = False) -> tuple[Translator, DecodeConfig]:
    """(Translator, DecodeConfig) of --model_dir, --checkpoint / --average_last and the
    decode flags (DecodeConfig.with_overrides; `all_beams`: nbest defaults to the beam)."""
    from tf_transformer.decoding import translator as translator_lib
    from tf_transformer.model_dir import ModelDir

    check_restore_flags()
    model_dir = ModelDir(FLAGS.model_dir)
    config = model_dir.read_config()  # the one read: the Translator is built from it
    decode = config.decode.with_overrides(decode_overrides(), all_beams)
    translator = translator_lib.Translator.from_model_dir(
        model_dir, FLAGS.checkpoint, decode, FLAGS.average_last, config=config)
    return translator, decode


def define_model_flags() -> None:
    """--preset and one override flag per config field below; unset ones keep the preset's."""
    flags.DEFINE_string("preset", "tiny", "Preset (python -m tf_transformer.presets lists them).")
    for group in (_MODEL_OVERRIDES, _DATA_OVERRIDES, _TRAIN_OVERRIDES):
        for name, (kind, help_text) in group.items():
            default = BINARY_DEFAULTS.get(name)
            _DEFINE[kind](name, default, f"{help_text} Default: "
                          + (f"{default}." if default is not None else "the preset's."))


def _overrides(group: dict) -> dict:
    """The flags of `group` the user set: name -> value."""
    return {name: getattr(FLAGS, name) for name in group if getattr(FLAGS, name) is not None}


def config_from_flags(vocab_size: int | None = None) -> Config:
    """The preset, then every flag the user set, validated by the dataclasses."""
    config = presets.get_preset(FLAGS.preset, vocab_size)
    return Config(
        model=config.model.with_overrides(_overrides(_MODEL_OVERRIDES)),
        data=dataclasses.replace(config.data, **_overrides(_DATA_OVERRIDES)),
        train=dataclasses.replace(config.train, **_overrides(_TRAIN_OVERRIDES)),
        decode=config.decode)


# ModelConfig fields a fine-tuned model may change: regularisation, not its weights' shapes.
FINE_TUNING_MODEL_CHANGES = ("dropout", "attention_dropout", "relu_dropout")


class InitFrom(NamedTuple):
    """--init_from=MODEL_DIR[:CHECKPOINT], read."""
    model_dir: ModelDir
    checkpoint: str | None  # None: the latest
    config: Config  # the fine-tuned model's (fine_tuning_config), of the source's vocab size


def init_from_flags() -> InitFrom:
    """--init_from; UsageError unless MODEL_DIR holds a config.json and is not --model_dir.
    Imports TensorFlow (model_dir/): call after the process defaults."""
    from tf_transformer.model_dir import ModelDir

    source_dir, checkpoint = FLAGS.init_from, None
    if not ModelDir(source_dir).is_model_dir():
        source_dir, _, checkpoint = FLAGS.init_from.rpartition(":")
        if not (source_dir and checkpoint and ModelDir(source_dir).is_model_dir()):
            raise app.UsageError(f"--init_from={FLAGS.init_from}: no model directory "
                                 "(config.json) there, nor before its last ':'")
    if os.path.realpath(source_dir) == os.path.realpath(FLAGS.model_dir):
        raise app.UsageError("--init_from names --model_dir itself: fine-tuning writes a new "
                             "--model_dir (rerunning a command resumes its --model_dir)")
    source = ModelDir(source_dir)
    return InitFrom(source, checkpoint, fine_tuning_config(source.read_config()))


def fine_tuning_config(source: Config) -> Config:
    """The Config of a model fine-tuned from `source` (the --init_from model's config.json):
    its architecture and settings, with the data and train flags the user set and
    --dropout / --attention_dropout / --relu_dropout. --preset, or a model flag that would change the
    architecture, is a UsageError. The vocabulary size stays the source's (Config.with_vocab_size)."""
    if FLAGS["preset"].present:
        raise app.UsageError("--preset with --init_from: the architecture is the source "
                             "model's (its config.json)")
    model = _overrides(_MODEL_OVERRIDES)
    changed = {name: (getattr(source.model, name), value) for name, value in model.items()
               if name not in FINE_TUNING_MODEL_CHANGES and value != getattr(source.model, name)}
    if changed:
        raise app.UsageError(
            "--init_from keeps the source model's architecture; these flags would change it "
            f"(source, requested): {changed}")
    return Config(
        model=dataclasses.replace(source.model, **{
            name: value for name, value in model.items() if name in FINE_TUNING_MODEL_CHANGES}),
        data=dataclasses.replace(source.data, **_overrides(_DATA_OVERRIDES)),
        train=dataclasses.replace(source.train, **_overrides(_TRAIN_OVERRIDES)),
        decode=source.decode)


def run_binary(main: Callable, module_name: str) -> None:
    """app.run(main) for the binary `module_name`, run by `python -m` (`module_name`
    "__main__") or by its console command (pyproject.toml's `tf-transformer-*`), then
    process_defaults.exit_now. For a console command, absl's --help prints the
    docstring and lists the key flags of the `__main__` module (sys.argv[0]), its
    launcher script, so the binary's are lent to it first."""
    if module_name != "__main__":
        for flag in FLAGS.get_key_flags_for_module(module_name):
            FLAGS.register_key_flag_for_module(sys.argv[0], flag)
        launcher = sys.modules["__main__"]
        launcher.__doc__ = launcher.__doc__ or sys.modules[module_name].__doc__
    try:
        app.run(main)
    except SystemExit as done:
        process_defaults.exit_now(done.code)


__all__ = ["InitFrom", "ModelConfig", "config_from_flags", "decode_overrides",
           "define_corpus_binary_flags", "define_decode_flags",
           "define_model_dir_flags", "define_model_flags", "define_restore_flags",
           "fine_tuning_config", "init_from_flags", "run_binary", "translator_from_flags"]
