"""Prints one epoch's batching figures, with and without length bucketing.

  python -m data.corpus_stats --data=data/libreoffice-help.en-de/train.tsv \
      --vocab=runs/spm8k.model --tokens_per_batch=4096

Two lines of space-separated key=value figures: `bucketed` (the training
pipeline of tf_transformer/inputs/pipeline.py, one epoch, no repeat) and `plain`
(a fixed number of pairs per batch, tokens_per_batch // longest pair, each batch
padded to its longest pair). padding_efficiency = non-pad tokens / all padded
positions of source and target; max_batch_tokens = the largest B * L.
"""

from absl import flags

from tf_transformer import flags as flags_lib
from tf_transformer import process_defaults
from tf_transformer.config import DataConfig

DATA = flags.DEFINE_string("data", None,
                           "corpus spec (see tf_transformer/inputs/corpus.py); required")
VOCAB = flags.DEFINE_string("vocab", None, "SentencePiece .model file; required")
TOKENS_PER_BATCH = flags.DEFINE_integer("tokens_per_batch", 4096, "padded tokens per batch")
MAX_LENGTH = flags.DEFINE_integer("max_length", DataConfig.max_length, "tokens per side")
BUCKET_MULTIPLE = flags.DEFINE_integer("bucket_multiple", DataConfig.bucket_multiple,
                                       "bucket boundaries rounded up to this")


def format_stats(name: str, figures: dict) -> str:
    return " ".join([name] + [f"{key}={value}" for key, value in figures.items()])


def main(argv):
    del argv
    process_defaults.apply()  # before TensorFlow's import
    from tf_transformer.inputs import pipeline, stats, streamed, tokenizer

    pairs = streamed.open_corpus(DATA.value)  # text files stream: any size
    vocab = tokenizer.Tokenizer(VOCAB.value)
    config = DataConfig(max_length=MAX_LENGTH.value, tokens_per_batch=TOKENS_PER_BATCH.value,
                        bucket_multiple=BUCKET_MULTIPLE.value, deterministic=True)
    skipped = {"skipped": stats.count_over_length(pairs, vocab, config.max_length)}
    bucketed = pipeline.make_dataset(pairs, vocab, config, training=True, repeat=False,
                                           count_skipped=False)
    plain = stats.make_plain_dataset(pairs, vocab, config)
    print(format_stats("bucketed", {**stats.epoch_stats(bucketed), **skipped}))
    print(format_stats("plain", {**stats.epoch_stats(plain), **skipped}))


if __name__ == "__main__":
    flags.mark_flags_as_required(["data", "vocab"])
    flags_lib.run_binary(main, __name__)
