"""Trains a Transformer: `python -m tf_transformer.train --train_data=... --model_dir=...`.

Progress lines hold step=, loss=, lr=, tokens_per_sec=, tokens_per_sec_per_replica=,
ms_per_step=, grad_norm=, skipped_steps= (and loss_scale=, model_tflops=, mfu=).
SIGTERM or Ctrl-C checkpoints and exits cleanly; rerunning resumes.
With --dev_data each checkpoint is scored (`eval step=` lines: dev_loss, dev_BLEU on the
first --dev_bleu_sentences pairs), MODEL_DIR/best/ keeps the --keep_best best and
--early_stop=N stops after N evaluations without improvement. A loss flat at the level of
a unigram model for --divergence_steps steps is reported as a `warning: diverged?` line.
Paper recipes: --flagfile=tf_transformer/recipes/wmt14_en_de_base.flags (and _big, en_fr).
One shared vocabulary by default; any of --source_vocab, --target_vocab, --source_vocab_size,
--target_vocab_size gives each side its own (embeddings not shared): pairs in two scripts.
Fine-tuning: --init_from=MODEL_DIR[:CHECKPOINT] starts a new --model_dir from a trained
model's weights (fine_tuning.py), with a fresh optimizer and schedule.
"""

import sys

from absl import app, flags, logging

from tf_transformer import flags as flags_lib
from tf_transformer import process_defaults

flags.DEFINE_string("train_data", None,
                    "Training corpus spec (TSV, SRC,TGT files, or tfds:...); required.")
flags.DEFINE_string("dev_data", None,
                    "Dev corpus spec: dev loss and BLEU at each checkpoint, the best kept in "
                    "MODEL_DIR/best/; default: none.")
flags.DEFINE_string("vocab", None, "SentencePiece model; default: MODEL_DIR/vocab.model, "
                    "trained from --train_data if missing.")
flags.DEFINE_integer("vocab_size", 8000, "Size of a vocabulary trained on the spot.")
flags.DEFINE_bool("byte_fallback", True,
                  "Vocabularies trained on the spot have SentencePiece byte fallback: a "
                  "character without a piece becomes its UTF-8 byte pieces, never <unk>.")
flags.DEFINE_string("source_vocab", None,
                    "Separate vocabularies (embeddings not shared): the source side's "
                    "SentencePiece model; default: MODEL_DIR/source_vocab.model, trained from "
                    "the sources if missing.")
flags.DEFINE_string("target_vocab", None,
                    "Separate vocabularies: the target side's; default: "
                    "MODEL_DIR/target_vocab.model, trained from the targets if missing.")
flags.DEFINE_integer("source_vocab_size", None,
                     "Separate vocabularies: size of a source vocabulary trained on the spot; "
                     "default: --vocab_size.")
flags.DEFINE_integer("target_vocab_size", None,
                     "Separate vocabularies: size of a target vocabulary trained on the spot; "
                     "default: --vocab_size.")
flags.DEFINE_string("init_from", None,
                    "Fine-tune: MODEL_DIR[:CHECKPOINT] (CHECKPOINT: best, a checkpoint path or a "
                    "name in MODEL_DIR such as ckpt-300; default: the latest) whose weights start "
                    "a new --model_dir at step 0, with a fresh optimizer (the learning rate warms "
                    "up again over --warmup_steps). The architecture and every other setting are "
                    "the source's config.json's unless a data or train flag (or --dropout) sets "
                    "them; the vocabulary is the source's unless --vocab names another (pieces "
                    "both hold keep their embeddings). Used only while --model_dir holds no "
                    "checkpoint: rerunning resumes it. Default: none (train from scratch).")
flags_lib.define_model_dir_flags()
flags.DEFINE_float("max_minutes", None,
                   "Stop after this many minutes of training; default: no limit.")
flags.DEFINE_integer("eval_every", 0, "Steps between dev evaluations (0: at checkpoints).")
flags.DEFINE_integer("dev_bleu_sentences", 100,
                     "The first N dev pairs translated for dev BLEU at each evaluation (0: none, "
                     "select by dev loss). 100 cost ~4 small-preset train steps on CPU.",
                     lower_bound=0)
flags.DEFINE_enum("strategy", "auto", ["auto", "one_device", "mirrored", "multi_worker"],
                  "Distribution strategy (multi_worker reads TF_CONFIG).")
flags.DEFINE_integer("cpu_devices", 0, "Split the CPU into N logical devices (mirrored on CPU).")
flags.DEFINE_float("peak_tflops", None,
                   "Peak TFLOP/s of one device for the log's MFU (default: known for A100 312, "
                   "H100 989 bfloat16 dense; none on CPU).")
flags.DEFINE_integer("intra_op_threads", 0, "TensorFlow intra-op threads (0: default).")
flags.DEFINE_integer("inter_op_threads", 0, "TensorFlow inter-op threads (0: default).")
flags_lib.define_model_flags()
flags.mark_flags_as_required(["train_data", "model_dir"])
flags.adopt_module_key_flags(flags_lib)  # --help lists the shared flags too
FLAGS = flags.FLAGS


def main(argv):
    del argv
    process_defaults.apply()  # before TensorFlow's import
    options = train_options()
    from tf_transformer.training import run
    try:
        run.train_and_evaluate(options)
    except run.NonFiniteLossError as error:
        logging.error("%s", error)
        sys.exit(2)


def train_options():
    """The flags, checked, as a training/run.py TrainOptions (imports TensorFlow)."""
    from tf_transformer.training.run import TrainOptions
    request = vocabulary_request()
    if FLAGS.vocab and request.separate:
        raise app.UsageError("--vocab is one shared vocabulary: give --source_vocab and "
                             "--target_vocab (or sizes) for separate ones")
    if FLAGS.init_from and request.separate:
        raise app.UsageError("--init_from keeps the source model's vocabularies (or remaps a "
                             "new shared --vocab): no separate vocabulary flags")
    init_from = flags_lib.init_from_flags() if FLAGS.init_from else None
    return TrainOptions(
        train_data=FLAGS.train_data, model_dir=FLAGS.model_dir, vocabularies=request,
        config=init_from.config if init_from else flags_lib.config_from_flags(),
        dev_data=FLAGS.dev_data, dev_bleu_sentences=FLAGS.dev_bleu_sentences,
        eval_every=FLAGS.eval_every, max_minutes=FLAGS.max_minutes, strategy=FLAGS.strategy,
        cpu_devices=FLAGS.cpu_devices, peak_tflops=FLAGS.peak_tflops,
        intra_op_threads=FLAGS.intra_op_threads, inter_op_threads=FLAGS.inter_op_threads,
        init_from_dir=init_from.model_dir if init_from else None,
        init_from_checkpoint=init_from.checkpoint if init_from else None)


def vocabulary_request():
    """The vocabulary flags, as training/vocabularies.py takes them."""
    from tf_transformer.training.vocabularies import VocabularyRequest
    return VocabularyRequest(
        shared=FLAGS.vocab, size=FLAGS.vocab_size, byte_fallback=FLAGS.byte_fallback,
        source=FLAGS.source_vocab, target=FLAGS.target_vocab,
        source_size=FLAGS.source_vocab_size, target_size=FLAGS.target_vocab_size)


def run():
    """`python -m` and the `tf-transformer-train` command (pyproject.toml): main, then a quick exit."""
    flags_lib.run_binary(main, __name__)


if __name__ == "__main__":
    run()
