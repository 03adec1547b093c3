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

import dataclasses
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
    request = vocabulary_request()
    if FLAGS.vocab and request.separate:
        raise app.UsageError("--vocab is one shared vocabulary: give --source_vocab and "
                             "--target_vocab (or sizes) for separate ones")
    if FLAGS.init_from and request.separate:
        raise app.UsageError("--init_from keeps the source model's vocabularies (or remaps a "
                             "new shared --vocab): no separate vocabulary flags")
    init_from = flags_lib.init_from_flags() if FLAGS.init_from else None  # before TensorFlow

    import tensorflow as tf

    from tf_transformer import model_dir as model_dir_lib
    from tf_transformer.inputs import corpus, packing, pipeline, streamed, tokenizer
    from tf_transformer.training import distribution, divergence, precision, vocabularies
    from tf_transformer.training.evaluators import dev_loss_fn
    from tf_transformer.training.host_loop import NonFiniteLossError
    from tf_transformer.training.trainer import Trainer

    distribution.set_threads(FLAGS.intra_op_threads, FLAGS.inter_op_threads)
    distribution.split_cpu(FLAGS.cpu_devices)
    strategy = distribution.make_strategy(FLAGS.strategy, FLAGS.cpu_devices)
    logging.info("strategy %s with %d replicas", type(strategy).__name__,
                 strategy.num_replicas_in_sync)

    train_corpus = streamed.open_corpus(FLAGS.train_data)
    tok = vocabularies.vocabularies(request, FLAGS.model_dir, train_corpus,
                                    distribution.is_chief(strategy),
                                    init_from.model_dir if init_from else None)
    source_tok, target_tok = tokenizer.sides(tok)
    separate = source_tok is not target_tok
    config = flags_lib.with_vocab_size(init_from.config if init_from else
                                       flags_lib.config_from_flags(), target_tok.vocab_size,
                                       source_tok.vocab_size if separate else None)
    units, gpus = precision.cpu_matrix_units(), len(tf.config.list_logical_devices("GPU"))
    config = precision.resolve(config, units, gpus)
    logging.info("training dtype %s; CPU matrix units: %s", config.train.dtype,
                 ",".join(units) or "none known")
    for warning in precision.warnings(config.train.dtype, units, gpus):
        logging.warning("%s", warning)
    if distribution.is_chief(strategy):
        model_dir_lib.prepare_model_dir(FLAGS.model_dir, config, source_tok.model_proto,
                                        target_tok.model_proto if separate else None)
    logging.info("config:\n%s", config.to_json())

    evaluate_fn = None
    if FLAGS.dev_data:
        dev_corpus = corpus.read_corpus(FLAGS.dev_data)
        shards = distribution.Shards(strategy)  # split over every replica and worker
        dev_fn = pipeline.dataset_fn(dev_corpus, tok, config.data, training=False)
        evaluate_fn = dev_loss_fn(dev_fn, config.train.label_smoothing, shards)
        if FLAGS.dev_bleu_sentences:
            from tf_transformer.cli import evaluation
            evaluate_fn = evaluation.combine(evaluate_fn, evaluation.dev_bleu_fn(
                dev_corpus, tok, config, FLAGS.dev_bleu_sentences, shards=shards))

    def train_dataset_fn(start_step):
        # 0 when the trainer restores the saved input position; otherwise (a
        # checkpoint without one) resuming starts a new, differently seeded pass.
        data = dataclasses.replace(config.data, seed=config.data.seed + start_step)
        if data.packing:
            return packing.dataset_fn(train_corpus, tok, data)
        return pipeline.dataset_fn(train_corpus, tok, data, training=True)

    unigram = None
    if config.train.divergence_steps:
        unigram = divergence.corpus_unigram_loss(train_corpus, target_tok,
                                                 config.train.label_smoothing)
        print_progress(f"unigram_loss={unigram:.4f} (a loss flat at this level: diverged)")
    trainer = Trainer(config, FLAGS.model_dir, strategy, peak_tflops=FLAGS.peak_tflops)
    if init_from:
        from tf_transformer.training import fine_tuning
        with strategy.scope():
            record = fine_tuning.start(trainer.model, FLAGS.model_dir, init_from.model_dir,
                                       init_from.checkpoint,
                                       None if separate else source_tok.model_proto,
                                       distribution.is_chief(strategy))
        print_progress("init_from " + " ".join(f"{k}={v}" for k, v in record.items())
                       if record else "init_from: resuming --model_dir's checkpoint")
    try:
        result = trainer.train(train_dataset_fn, config.train.max_steps, FLAGS.max_minutes,
                               evaluate_fn=evaluate_fn, eval_every=FLAGS.eval_every,
                               log_fn=print_progress, unigram_loss=unigram)
    except NonFiniteLossError as error:
        logging.error("%s", error)
        sys.exit(2)
    print_progress(f"done step={result.step} loss={result.loss:.4f} "
                   f"stopped_by={result.stopped_by} checkpoint={result.checkpoint}"
                   + (model_dir_lib.best_summary(FLAGS.model_dir) if evaluate_fn else ""))


def vocabulary_request():
    """The vocabulary flags, as training/vocabularies.py takes them."""
    from tf_transformer.training.vocabularies import VocabularyRequest
    return VocabularyRequest(
        shared=FLAGS.vocab, size=FLAGS.vocab_size, byte_fallback=FLAGS.byte_fallback,
        source=FLAGS.source_vocab, target=FLAGS.target_vocab,
        source_size=FLAGS.source_vocab_size, target_size=FLAGS.target_vocab_size)


def print_progress(line: str) -> None:
    print(line, flush=True)
    logging.info(line)


def run():
    """`python -m` and the `tf-transformer-train` command (pyproject.toml): main, then a quick exit."""
    flags_lib.run_binary(main, __name__)


if __name__ == "__main__":
    run()
