"""Trains the shared SentencePiece vocabulary on both sides of a corpus (or, with
--side, one side's, for separate source and target vocabularies).

  python -m data.vocab --data=data/libreoffice-help.en-de/train.tsv \
      --vocab_size=8000 --output=runs/spm8k.model

The paper's sizes (section 5.1): 37000 BPE for WMT EN-DE, 32000 for EN-FR;
8000 suits the embedded corpus. Text files are streamed, never held whole:
SentencePiece keeps a seeded sample of at most 4M sentences
(tokenizer.MAX_TRAINING_SENTENCES). Ids: <pad>=0 <unk>=1 <s>=2 </s>=3 (config.py).
With --byte_fallback (the default) 256 of the pieces are UTF-8 bytes (ids 4-259),
so a character without a piece is spelled in bytes, never <unk>.
"""

from absl import flags, logging

from tf_transformer import flags as flags_lib
from tf_transformer import process_defaults
from tf_transformer.config import VOCAB_MODEL_TYPES, VOCAB_SIDES

DATA = flags.DEFINE_string("data", None,
                           "corpus spec (see tf_transformer/inputs/corpus.py); required")
VOCAB_SIZE = flags.DEFINE_integer("vocab_size", 8000, "pieces, special ones included")
OUTPUT = flags.DEFINE_string("output", None, "where to write the .model file; required")
MODEL_TYPE = flags.DEFINE_enum("model_type", "bpe", list(VOCAB_MODEL_TYPES),
                               "SentencePiece algorithm")
CHARACTER_COVERAGE = flags.DEFINE_float("character_coverage", 0.9995,
                                        "share of characters kept as pieces")
SEED = flags.DEFINE_integer("seed", 1, "SentencePiece random seed")
BYTE_FALLBACK = flags.DEFINE_bool("byte_fallback", True,
                                  "characters without a piece become UTF-8 byte pieces "
                                  "(256 of the pieces), not <unk>")
SIDE = flags.DEFINE_enum("side", "both", ["both", *VOCAB_SIDES],
                         "train on both sides (a shared vocabulary) or on one")


def main(argv):
    del argv
    process_defaults.apply()  # before TensorFlow's import
    from tf_transformer.inputs import corpus, streamed, tokenizer

    pairs = streamed.open_corpus(DATA.value)  # text files stream; SentencePiece samples them
    tokenizer.train_sentencepiece(pairs, VOCAB_SIZE.value, OUTPUT.value,
                                  model_type=MODEL_TYPE.value,
                                  character_coverage=CHARACTER_COVERAGE.value, seed=SEED.value,
                                  byte_fallback=BYTE_FALLBACK.value,
                                  side=None if SIDE.value == "both" else SIDE.value)
    vocab = tokenizer.Tokenizer(OUTPUT.value)
    logging.info("wrote %s: %d pieces", OUTPUT.value, vocab.vocab_size)
    counted = f" pairs={len(pairs)}" if isinstance(pairs, corpus.Corpus) else ""
    print(f"{OUTPUT.value} vocab_size={vocab.vocab_size}{counted}")


if __name__ == "__main__":
    flags.mark_flags_as_required(["data", "output"])
    flags_lib.run_binary(main, __name__)
