"""Trains a Transformer: `python -m tf_transformer.train --train_data=... --model_dir=...`.

Progress lines hold step=, loss=, lr=, tokens_per_sec=, tokens_per_sec_per_replica=,
ms_per_step=, grad_norm=, skipped_steps= (and loss_scale=, model_tflops=, mfu=).
SIGTERM or Ctrl-C checkpoints and exits cleanly; rerunning resumes.
With --dev_data each checkpoint is scored (`eval step=` lines: dev_loss, dev_BLEU on the
first --dev_bleu_sentences pairs), MODEL_DIR/best/ keeps the --keep_best best and
--early_stop=N stops after N evaluations without improvement. A loss flat at the level of
a unigram model for --divergence_steps steps is reported as a `warning: diverged?` line.
Paper recipes: --flagfile=tf_transformer/recipes/wmt14_en_de_base.flags (and _big, en_fr).
"""

import dataclasses
import os
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

    from tf_transformer.inputs import corpus, packing, pipeline, streamed
    from tf_transformer import model_dir as model_dir_lib
    from tf_transformer.training import distribution, divergence, selection
    from tf_transformer.training.evaluators import dev_loss_fn
    from tf_transformer.training.trainer import NonFiniteLossError, Trainer

    distribution.set_threads(FLAGS.intra_op_threads, FLAGS.inter_op_threads)
    distribution.split_cpu(FLAGS.cpu_devices)
    strategy = distribution.make_strategy(FLAGS.strategy, FLAGS.cpu_devices)
    logging.info("strategy %s with %d replicas", type(strategy).__name__,
                 strategy.num_replicas_in_sync)

    train_corpus = streamed.open_corpus(FLAGS.train_data)
    tok = shared_vocabulary(train_corpus, distribution.is_chief(strategy))
    config = flags_lib.with_vocab_size(flags_lib.config_from_flags(), tok.vocab_size)
    if distribution.is_chief(strategy):
        model_dir_lib.prepare_model_dir(FLAGS.model_dir, config, tok.model_proto)
    logging.info("config:\n%s", config.to_json())

    evaluate_fn = None
    if FLAGS.dev_data:
        dev_corpus = corpus.read_corpus(FLAGS.dev_data)
        shards = distribution.Shards(strategy)  # split over every replica and worker
        dev_fn = pipeline.dataset_fn(dev_corpus, tok, config.data, training=False)
        evaluate_fn = dev_loss_fn(dev_fn, config.train.label_smoothing, shards)
        if FLAGS.dev_bleu_sentences:
            from tf_transformer import evaluation
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
        unigram = divergence.corpus_unigram_loss(train_corpus, tok, config.train.label_smoothing)
        print_progress(f"unigram_loss={unigram:.4f} (a loss flat at this level: diverged)")
    trainer = Trainer(config, FLAGS.model_dir, strategy, peak_tflops=FLAGS.peak_tflops)
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


def shared_vocabulary(train_corpus, chief: bool):
    """--vocab, or MODEL_DIR/vocab.model trained by the chief while the other workers wait."""
    from tf_transformer.inputs import tokenizer
    from tf_transformer import model_dir as model_dir_lib
    from tf_transformer.training import distribution

    vocab_path = FLAGS.vocab or os.path.join(FLAGS.model_dir, model_dir_lib.VOCAB_FILE)
    if not os.path.exists(vocab_path):
        if chief:
            logging.info("training a %d-piece vocabulary into %s", FLAGS.vocab_size, vocab_path)
            os.makedirs(os.path.dirname(vocab_path) or ".", exist_ok=True)
            tokenizer.train_sentencepiece(train_corpus, FLAGS.vocab_size, vocab_path + ".tmp")
            os.replace(vocab_path + ".tmp", vocab_path)
        else:
            distribution.wait_for_file(vocab_path)
    return tokenizer.Tokenizer(vocab_path)


def print_progress(line: str) -> None:
    print(line, flush=True)
    logging.info(line)


if __name__ == "__main__":
    app.run(main)
