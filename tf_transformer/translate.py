"""Translates sentences, one a line: `python -m tf_transformer.translate --model_dir=DIR`.

Reads --input (default stdin), writes --output (default stdout), one line per
input line and in input order (--nbest=N: N lines `index<TAB>score<TAB>text`,
index counting input lines from 0). It streams: every --chunk_size lines are
sorted by length, translated and written (flushed), so it works in a pipe and
on files larger than memory. Decoding flags default to the model directory's
config.json; --model_dir may be an averaged directory.
--checkpoint=best loads the best checkpoint by dev score (MODEL_DIR/best/, kept by
training with --dev_data); with --average_last=N, the mean of the N best.
Bad lines never stop the run: invalid UTF-8 bytes become U+FFFD, an empty line
translates to an empty line, an over-long line is truncated to the model's
maximum source length; each kind is logged as a warning at the end.

Sampling instead of the beam (back-translation): any --sampling_* flag draws one
output per line (top-k, then nucleus top-p, at a temperature; --seed reproduces
them for the same input and batch size). --with_alignments=hard|soft appends
`<TAB>alignment` to each output line: hard as Pharaoh `i-j` pairs (source token i,
target token j, SentencePiece tokens from 0), soft as the matrix (per target token,
comma-separated weights over the source tokens and EOS; tokens separated by
spaces). --replace_unknown_target replaces each <unk> of the output by the source
text it aligns to. --target_prefix=FILE (one line per input line, an empty line for
none) makes each output start with its prefix, the search (beam or sampling) going on
from there: interactive translation, or a forced target-language tag.
"""

import sys

from absl import app, flags, logging

from tf_transformer import flags as flags_lib
from tf_transformer import process_defaults

flags_lib.define_restore_flags()
flags_lib.define_decode_flags(
    nbest_help="Hypotheses per input (<= beam_size), as lines index<TAB>score<TAB>text; "
               "default: one line with the best.")
flags.DEFINE_string("input", None, "Input text file; default: stdin.")
flags.DEFINE_string("output", None, "Output file; default: stdout.")
flags.DEFINE_integer("chunk_size", 4096,
                     "Lines sorted by length and translated together before they are written.",
                     lower_bound=1)
flags.DEFINE_bool("progress", None,
                  "Progress lines on stderr (sentences, sentences/s); default: on with --input.")
flags.DEFINE_string("plot_attention", None,
                    "Write attention heat maps of the first line to this PNG; default: none.")
flags.DEFINE_integer("sampling_topk", None,
                     "Sample (one output per line) from the K most probable tokens (0: all); "
                     "default: no sampling, unless another --sampling_* flag is set.")
flags.DEFINE_float("sampling_topp", None,
                   "Sample from the smallest set of most probable tokens with probability >= P "
                   "(0 or 1: all); default: no sampling, unless another --sampling_* is set.")
flags.DEFINE_float("sampling_temperature", None,
                   "Sample at this temperature (log-probs / T); default: 1 when sampling.")
flags.DEFINE_integer("seed", 0, "Seed of the sampling draws.")
flags.DEFINE_enum("with_alignments", None, ["hard", "soft"],
                  "Append <TAB>alignment to each output: hard (Pharaoh i-j) or soft (the "
                  "matrix); default: none.")
flags.DEFINE_bool("replace_unknown_target", False,
                  "Replace each <unk> of the output by the source text it aligns to.")
flags.DEFINE_string("target_prefix", None,
                    "A file of target prefixes, one per input line (an empty line: none): "
                    "each output starts with its prefix, then the search goes on freely "
                    "(beam or sampling); default: none.")
flags.adopt_module_key_flags(flags_lib)
FLAGS = flags.FLAGS
SAMPLING_FLAGS = ("sampling_topk", "sampling_topp", "sampling_temperature")


def main(argv):
    del argv
    process_defaults.apply()  # before TensorFlow's import
    sampling = any(FLAGS[name].value is not None for name in SAMPLING_FLAGS)
    if sampling and (FLAGS.nbest is not None or FLAGS.with_alignments
                     or FLAGS.replace_unknown_target):  # refused before TensorFlow's import
        raise app.UsageError("sampling draws one output: no --nbest, --with_alignments or "
                             "--replace_unknown_target")
    if FLAGS.target_prefix and (FLAGS.nbest is not None or FLAGS.with_alignments
                                or FLAGS.replace_unknown_target):
        raise app.UsageError("--target_prefix gives the best output: no --nbest, "
                             "--with_alignments or --replace_unknown_target")
    from tf_transformer.cli import decoders, streaming

    translator, decode = flags_lib.translator_from_flags()
    decode_batch = None
    if sampling:
        decode_batch = decoders.sampling(
            translator, FLAGS.sampling_topk or 0, FLAGS.sampling_topp or 0.0,
            FLAGS.sampling_temperature or 1.0, FLAGS.seed)
    elif FLAGS.with_alignments or FLAGS.replace_unknown_target:
        decode_batch = decoders.with_alignments(translator, FLAGS.nbest is not None,
                                                FLAGS.replace_unknown_target)
    show_progress = FLAGS.progress if FLAGS.progress is not None else bool(FLAGS.input)
    progress = streaming.Progress("translate") if show_progress else None
    source = open(FLAGS.input, "rb") if FLAGS.input else sys.stdin.buffer
    prefixes = open(FLAGS.target_prefix, "rb") if FLAGS.target_prefix else None
    out = open(FLAGS.output, "w", encoding="utf-8") if FLAGS.output else sys.stdout
    try:
        summary = streaming.translate_stream(
            translator, source, out, batch_size=decode.batch_size, chunk_size=FLAGS.chunk_size,
            nbest=FLAGS.nbest is not None, progress=progress, decode_batch=decode_batch,
            alignment_format=FLAGS.with_alignments, prefix_source=prefixes)
    except streaming.PrefixLinesError as error:
        raise app.UsageError(f"--target_prefix={FLAGS.target_prefix}: {error}") from None
    finally:
        for stream in (source, prefixes, out):
            if stream not in (None, sys.stdin.buffer, sys.stdout):
                stream.close()
    if progress:
        progress.finish()
    if FLAGS.plot_attention and summary.first_line is not None:
        from tf_transformer.cli import attention_plot
        attention_plot.plot_translation(translator, summary.first_line, FLAGS.plot_attention)
        logging.info("attention of input line 0 written to %s", FLAGS.plot_attention)


def run():
    """`python -m` and the `tf-transformer-translate` command (pyproject.toml): main, then a quick exit."""
    flags_lib.run_binary(main, __name__)


if __name__ == "__main__":
    run()
