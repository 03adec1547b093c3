"""Input pipeline throughput alone: non-pad source + target tokens per second.

  python -m bench.input_pipeline [--data=SPEC] [--vocab=SPM_MODEL] [--readers=memory,stream]

One epoch of the training pipeline (tokenise, filter, bucket; no model), over
the full shared train corpus when ../shared exists, else the embedded one.
Without --vocab, a vocabulary of --vocab_size is trained first (not timed).
The figure comes from `stats.tokens_per_second`, for reuse. `--readers` times
the in-memory corpus and/or the one streamed from disk (streamed.py), one line each.

Then, unless --no_compare_step, the trainer's own step of the `small` preset
is timed in the same process on the pipeline's own batches, and a line
`versus_train_step` gives the trainer's consumption and the ratio
pipeline / trainer (the input must stay at least 10x ahead).
"""

import os
import tempfile

from absl import app, flags

from tf_transformer.config import DataConfig
from tf_transformer.inputs import corpus, pipeline, stats, streamed, tokenizer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_TRAIN = os.path.join(REPO, "..", "shared", "corpora", "libreoffice-help.en-de", "train.tsv")
EMBEDDED_TRAIN = os.path.join(REPO, "data", "libreoffice-help.en-de", "train.tsv")

DATA = flags.DEFINE_string("data", None, "corpus spec; default: shared train, else embedded")
VOCAB = flags.DEFINE_string("vocab", None, "SentencePiece .model; default: train one")
VOCAB_SIZE = flags.DEFINE_integer("vocab_size", 8000, "when training a vocabulary")
TOKENS_PER_BATCH = flags.DEFINE_integer("tokens_per_batch", 4096, "per replica")
DETERMINISTIC = flags.DEFINE_bool("deterministic", False, "keep parallel map order")
COMPARE_STEP = flags.DEFINE_bool("compare_step", True, "also time small-preset training steps")
STEPS = flags.DEFINE_integer("steps", 8, "timed training steps for the comparison")
READERS = flags.DEFINE_list("readers", ["memory"],
                            "memory (corpus.read_corpus) and/or stream (streamed.open_corpus)")
MAX_BATCHES = flags.DEFINE_integer("max_batches", None, "stop timing after this many batches")


def train_step_tokens_per_second(dataset, vocab_size: int, steps: int) -> float:
    """Source+target non-pad tokens/s the small preset's training step consumes."""
    import time

    import tensorflow as tf

    from tf_transformer import presets
    from tf_transformer.config import PAD_ID
    from tf_transformer.training.trainer import Trainer

    config = presets.get_preset("small", vocab_size)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    trainer = Trainer(config, tempfile.mkdtemp(), strategy)
    batches = list(dataset.take(steps + 2))  # held in memory: the timing sees no input cost
    tokens = [int(tf.reduce_sum(tf.cast(b["source"] != PAD_ID, tf.int32))
                  + tf.reduce_sum(tf.cast(b["target_out"] != PAD_ID, tf.int32))) for b in batches]
    iterator = iter(strategy.distribute_datasets_from_function(
        lambda ctx: tf.data.Dataset.from_generator(
            lambda: iter(batches), output_signature=dataset.element_spec)))
    step = trainer.step_fn()
    for _ in range(2):
        float(step(iterator)["loss"])
    start = time.perf_counter()
    for _ in range(steps):
        float(step(iterator)["loss"])
    return sum(tokens[2:]) / (time.perf_counter() - start)


def main(argv):
    del argv
    spec = DATA.value or (SHARED_TRAIN if os.path.exists(SHARED_TRAIN) else EMBEDDED_TRAIN)
    vocab_path = VOCAB.value
    if vocab_path is None:
        vocab_path = os.path.join(tempfile.mkdtemp(), "spm.model")
        tokenizer.train_sentencepiece(streamed.open_corpus(spec), VOCAB_SIZE.value, vocab_path)
    vocab = tokenizer.Tokenizer(vocab_path)
    config = DataConfig(tokens_per_batch=TOKENS_PER_BATCH.value,
                        deterministic=DETERMINISTIC.value)
    for reader in READERS.value:
        pairs = corpus.read_corpus(spec) if reader == "memory" else streamed.open_corpus(spec)
        dataset = pipeline.make_dataset(pairs, vocab, config, training=True, repeat=False,
                                        count_skipped=False)
        figures = stats.tokens_per_second(dataset, MAX_BATCHES.value)
        size = f" pairs={len(pairs)}" if isinstance(pairs, corpus.Corpus) else ""
        print(f"input_pipeline reader={reader} "
              f"data={os.path.relpath(spec) if os.path.exists(spec) else spec}{size} "
              f"cpus={os.cpu_count()} "
              + " ".join(f"{key}={value}" for key, value in figures.items()), flush=True)
    if COMPARE_STEP.value:
        trainer = train_step_tokens_per_second(dataset, vocab.vocab_size, STEPS.value)
        input_rate = float(figures["tokens_per_second"])
        print(f"versus_train_step preset=small train_tokens_per_sec={trainer:.0f} "
              f"pipeline_tokens_per_sec={input_rate:.0f} ratio={input_rate / trainer:.1f}")

if __name__ == "__main__":
    app.run(main)
