"""A training run from start to end: the library call behind `python -m tf_transformer.train`.

`train_and_evaluate(options)` makes the distribution strategy, opens the corpus,
makes or reads the vocabularies, sizes and resolves the config, prepares the
model directory (the chief), builds the dev evaluators and the trainer
(fine-tuned from another model with `init_from_dir`), trains, and prints the
`done` line. The binary reads the flags (flags.py) into a `TrainOptions`; this
module never reads them.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf
from absl import logging

from tf_transformer.config import Config
from tf_transformer.inputs import corpus, packing, pipeline, streamed, tokenizer
from tf_transformer.model_dir import ModelDir
from tf_transformer.training import distribution, divergence, precision, vocabularies
from tf_transformer.training.evaluators import Evaluator, dev_loss_fn
from tf_transformer.training.host_loop import NonFiniteLossError
from tf_transformer.training.trainer import Trainer, TrainResult
from tf_transformer.training.vocabularies import VocabularyRequest

__all__ = ["NonFiniteLossError", "TrainOptions", "print_progress", "train_and_evaluate"]


@dataclasses.dataclass(frozen=True)
class TrainOptions:
    """A training run's choices beyond the Config: the training binary's flags, read.

    config: the preset with the user's overrides, or the --init_from model's
    (flags.fine_tuning_config); its vocabulary sizes are set here, from the
    vocabularies. init_from_dir / init_from_checkpoint: fine-tune from that model
    directory's checkpoint (None: the latest); None: train from scratch.
    """

    train_data: str
    model_dir: str
    config: Config
    vocabularies: VocabularyRequest
    dev_data: str | None = None
    dev_bleu_sentences: int = 100
    eval_every: int = 0
    max_minutes: float | None = None
    strategy: str = "auto"
    cpu_devices: int = 0
    peak_tflops: float | None = None
    intra_op_threads: int = 0
    inter_op_threads: int = 0
    init_from_dir: ModelDir | None = None
    init_from_checkpoint: str | None = None


def print_progress(line: str) -> None:
    """A progress line on stdout (flushed) and in the log."""
    print(line, flush=True)
    logging.info(line)


def train_and_evaluate(options: TrainOptions) -> TrainResult:
    """Trains (and evaluates on the dev data) as `options` say; prints progress lines and
    the `done step= loss= stopped_by= checkpoint=` line. NonFiniteLossError at a NaN loss."""
    distribution.set_threads(options.intra_op_threads, options.inter_op_threads)
    distribution.split_cpu(options.cpu_devices)
    strategy = distribution.make_strategy(options.strategy, options.cpu_devices)
    logging.info("strategy %s with %d replicas", type(strategy).__name__,
                 strategy.num_replicas_in_sync)
    chief = distribution.is_chief(strategy)
    model_dir = ModelDir(options.model_dir)
    train_corpus = streamed.open_corpus(options.train_data)
    tok = vocabularies.vocabularies(options.vocabularies, model_dir, train_corpus, chief,
                                    options.init_from_dir)
    source_tok, target_tok = tokenizer.sides(tok)
    separate = source_tok is not target_tok
    config = _resolved_config(options.config, source_tok, target_tok)
    if chief:
        model_dir.prepare(config, source_tok.model_proto,
                          target_tok.model_proto if separate else None)
    logging.info("config:\n%s", config.to_json())
    evaluate_fn = _evaluator(options, config, tok, strategy)

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
    trainer = Trainer(config, model_dir, strategy, peak_tflops=options.peak_tflops)
    if options.init_from_dir:
        _fine_tune(trainer, options, None if separate else source_tok.model_proto, chief)
    result = trainer.train(train_dataset_fn, config.train.max_steps, options.max_minutes,
                           evaluate_fn=evaluate_fn, eval_every=options.eval_every,
                           log_fn=print_progress, unigram_loss=unigram)
    print_progress(f"done step={result.step} loss={result.loss:.4f} "
                   f"stopped_by={result.stopped_by} checkpoint={result.checkpoint}"
                   + (model_dir.best_summary() if evaluate_fn else ""))
    return result


def _resolved_config(config: Config, source_tok, target_tok) -> Config:
    """`config` of the vocabularies' sizes and a concrete dtype (precision.resolve)."""
    separate = source_tok is not target_tok
    config = config.with_vocab_size(target_tok.vocab_size,
                                    source_tok.vocab_size if separate else None)
    units, gpus = precision.cpu_matrix_units(), len(tf.config.list_logical_devices("GPU"))
    requested = config.train.dtype
    config = precision.resolve(config, units, gpus)
    print_progress(f"training dtype={config.train.dtype} requested={requested} "
                   f"gpus={gpus} cpu_matrix_units={','.join(units) or 'none_known'}")
    for warning in precision.warnings(config.train.dtype, units, gpus):
        logging.warning("%s", warning)
    return config


def _evaluator(options: TrainOptions, config: Config, tok, strategy) -> Evaluator | None:
    """Dev loss (and dev BLEU on the first `dev_bleu_sentences` pairs) at each
    evaluation, split over every replica and worker; None without dev data."""
    if not options.dev_data:
        return None
    dev_corpus = corpus.read_corpus(options.dev_data)
    shards = distribution.Shards(strategy)
    dev_fn = pipeline.dataset_fn(dev_corpus, tok, config.data, training=False)
    evaluate_fn = dev_loss_fn(dev_fn, config.train.label_smoothing, shards)
    if options.dev_bleu_sentences:
        from tf_transformer.cli import evaluation
        evaluate_fn = evaluation.combine(evaluate_fn, evaluation.dev_bleu_fn(
            dev_corpus, tok, config, options.dev_bleu_sentences, shards=shards))
    return evaluate_fn


def _fine_tune(trainer: Trainer, options: TrainOptions, vocab_proto: bytes | None,
               chief: bool) -> None:
    """Starts the trainer's model from `init_from_dir`'s weights (fine_tuning.py)."""
    from tf_transformer.training import fine_tuning
    with trainer.strategy.scope():
        record = fine_tuning.start(trainer.model, trainer.model_dir, options.init_from_dir,
                                   options.init_from_checkpoint, vocab_proto, chief)
    print_progress("init_from " + " ".join(f"{k}={v}" for k, v in record.items())
                   if record else "init_from: resuming --model_dir's checkpoint")
