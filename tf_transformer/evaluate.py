"""Scores a model on a corpus: `python -m tf_transformer.evaluate --model_dir=DIR --data=SPEC`.

SPEC is any corpus spec of tf_transformer.inputs.corpus.read_corpus (a TSV, two
line-aligned files, tfds:wmt14_translate/en-de:test, ...). Prints one line of
key=value figures (sacreBLEU, chrF, the paper-style tokenized BLEU: Moses
tokenizer for --target_lang + compound split, not comparable to sacreBLEU;
decode throughput) and the sacreBLEU signatures; progress lines go to stderr.
Decoding flags default to the model directory's config.json.
--checkpoint=best loads the best checkpoint by dev score (MODEL_DIR/best/, kept by
training with --dev_data); with --average_last=N, the mean of the N best.
"""

from absl import flags

from tf_transformer import flags as flags_lib
from tf_transformer import process_defaults

flags_lib.define_corpus_binary_flags("Corpus spec to translate and score; required.")
flags.adopt_module_key_flags(flags_lib)
flags.DEFINE_integer("max_sentences", 0, "Score only the first N pairs (0: all).", lower_bound=0)
flags.DEFINE_string("hypotheses", None,
                    "Also write the translations here, one a line; default: not written.")
flags.DEFINE_string("target_lang", "de",
                    "Moses tokenizer language for tok_bleu (the paper-style score) only.")
flags.DEFINE_bool("progress", True, "Progress lines on stderr (sentences, sentences/s).")
FLAGS = flags.FLAGS


def main(argv):
    del argv
    process_defaults.apply()  # before TensorFlow's import
    from tf_transformer.cli import evaluation
    from tf_transformer.cli import streaming
    from tf_transformer.inputs import corpus

    translator, decode = flags_lib.translator_for_corpus()
    pairs = corpus.read_corpus(FLAGS.data)

    def translate_fn(translator, sources, batch_size):  # the timed pass, after the warm-up
        progress = streaming.Progress("evaluate") if FLAGS.progress else None
        results = streaming.translate_sorted(translator, sources, batch_size, progress=progress)
        if progress:
            progress.finish()
        return results

    result = evaluation.evaluate_translator(translator, pairs, decode.batch_size,
                                            FLAGS.max_sentences, translate_fn=translate_fn,
                                            target_lang=FLAGS.target_lang)
    if FLAGS.hypotheses:
        with open(FLAGS.hypotheses, "w", encoding="utf-8") as f:
            f.writelines(h.replace("\n", " ") + "\n" for h in result["hypotheses"])
    print(f"bleu={result['bleu']:.2f} chrf={result['chrf']:.2f} tok_bleu={result['tok_bleu']:.2f} "
          f"sentences={result['sentences']} sentences_per_sec={result['sentences_per_sec']:.2f} "
          f"tokens_per_sec={result['tokens_per_sec']:.1f} beam_size={decode.beam_size} "
          f"alpha={decode.alpha} extra_length={decode.extra_length}")
    print(f"bleu_signature={result['bleu_signature']}")
    print(f"chrf_signature={result['chrf_signature']}")
    print(evaluation.TOK_BLEU_NOTE)


def run():
    """`python -m` and the `tf-transformer-evaluate` command (pyproject.toml): main, then a quick exit."""
    flags_lib.run_binary(main, __name__)


if __name__ == "__main__":
    run()
