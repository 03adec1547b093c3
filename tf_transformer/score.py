"""Scores given pairs: `python -m tf_transformer.score --model_dir=DIR --data=PAIRS.tsv`.

For rescoring, corpus filtering and quality estimation: each pair's log-probability
under the model, teacher-forced (the target and EOS, given the source), one line
per pair in input order, TAB-separated:

  index  log_prob  tokens  log_prob_per_token  score

index: the pair's line in --data, from 0 (bad lines are skipped, counted and
logged: no_tab, extra_tab, empty_side, invalid_utf8, too_long); log_prob: natural
log P(target + EOS | source); tokens: target SentencePiece tokens with EOS;
log_prob_per_token = log_prob / tokens; score = log_prob / ((5 + tokens) / 6) **
alpha, the GNMT length penalty of the beam search at --alpha (config.json's by
default), so a translation's score here is the score translate --nbest printed for
it. Sources over the model's maximum source length are truncated as translate
truncates them. --data is a TSV (`source<TAB>target`) or `SRC,TGT` line-aligned
files, optionally with `:reverse`. A summary line goes to stderr.
--checkpoint and --average_last pick the weights as for translate.
"""

import sys

from absl import flags

from tf_transformer import flags as flags_lib
from tf_transformer import process_defaults

flags.DEFINE_string("output", None, "Output file; default: stdout.")
flags_lib.define_corpus_binary_flags("Pairs to score (TSV, or SRC,TGT files); required.",
                                     search=False)
flags.adopt_module_key_flags(flags_lib)
FLAGS = flags.FLAGS


def main(argv):
    del argv
    process_defaults.apply()  # before TensorFlow's import
    translator, decode = flags_lib.translator_for_corpus()
    from tf_transformer.cli import scoring

    out = open(FLAGS.output, "w", encoding="utf-8") if FLAGS.output else sys.stdout
    try:
        totals = scoring.score_stream(translator, FLAGS.data, out, decode.batch_size)
    finally:
        if out is not sys.stdout:
            out.close()
    per_token = totals.log_prob / max(totals.tokens, 1)
    print(f"score: {totals.pairs} pairs, log_prob={totals.log_prob:.4f} tokens={totals.tokens} "
          f"log_prob_per_token={per_token:.6f} alpha={decode.alpha}", file=sys.stderr)


def run():
    """`python -m` and the `tf-transformer-score` command (pyproject.toml): main, then a quick exit."""
    flags_lib.run_binary(main, __name__)


if __name__ == "__main__":
    run()
