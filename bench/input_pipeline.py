"""Input pipeline throughput alone: non-pad source + target tokens per second.

  python -m bench.input_pipeline [--data=SPEC] [--vocab=SPM_MODEL]

One epoch of the training pipeline (tokenise, filter, bucket; no model), over
the full shared train corpus when ../shared exists, else the embedded one.
Without --vocab, a vocabulary of --vocab_size is trained first (not timed).
The figure comes from `input_pipeline.tokens_per_second`, for reuse.
"""

import os
import tempfile

from absl import app, flags

from tf_transformer import corpus, input_pipeline, tokenizer
from tf_transformer.config import DataConfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_TRAIN = os.path.join(REPO, "..", "shared", "corpora", "libreoffice-help.en-de", "train.tsv")
EMBEDDED_TRAIN = os.path.join(REPO, "data", "libreoffice-help.en-de", "train.tsv")

DATA = flags.DEFINE_string("data", None, "corpus spec; default: shared train, else embedded")
VOCAB = flags.DEFINE_string("vocab", None, "SentencePiece .model; default: train one")
VOCAB_SIZE = flags.DEFINE_integer("vocab_size", 8000, "when training a vocabulary")
TOKENS_PER_BATCH = flags.DEFINE_integer("tokens_per_batch", 4096, "per replica")
DETERMINISTIC = flags.DEFINE_bool("deterministic", False, "keep parallel map order")


def main(argv):
    del argv
    spec = DATA.value or (SHARED_TRAIN if os.path.exists(SHARED_TRAIN) else EMBEDDED_TRAIN)
    pairs = corpus.read_corpus(spec)
    vocab_path = VOCAB.value
    if vocab_path is None:
        vocab_path = os.path.join(tempfile.mkdtemp(), "spm.model")
        tokenizer.train_sentencepiece(pairs, VOCAB_SIZE.value, vocab_path)
    vocab = tokenizer.Tokenizer(vocab_path)
    config = DataConfig(tokens_per_batch=TOKENS_PER_BATCH.value,
                        deterministic=DETERMINISTIC.value)
    dataset = input_pipeline.make_dataset(pairs, vocab, config, training=True, repeat=False,
                                          count_skipped=False)
    figures = input_pipeline.tokens_per_second(dataset)
    print(f"input_pipeline data={os.path.relpath(spec) if os.path.exists(spec) else spec} "
          f"pairs={len(pairs)} cpus={os.cpu_count()} "
          + " ".join(f"{key}={value}" for key, value in figures.items()))


if __name__ == "__main__":
    app.run(main)
