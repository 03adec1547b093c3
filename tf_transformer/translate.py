"""Translates sentences, one a line: `python -m tf_transformer.translate --model_dir=DIR`.

Reads --input (default stdin), writes --output (default stdout), one line per
input line and in input order (--nbest=N: N lines `index<TAB>score<TAB>text`,
index counting input lines from 0). Decoding flags default to the model
directory's config.json; --model_dir may be an averaged directory.
Bad lines never stop the run: invalid UTF-8 bytes become U+FFFD, an empty line
translates to an empty line, an over-long line is truncated to the model's
maximum source length; each is logged as a warning.
"""

import sys

from absl import app, flags, logging

from tf_transformer import flags as flags_lib

flags_lib.define_model_dir_flags()
flags_lib.define_decode_flags()
flags_lib.define_once(flags.DEFINE_string, "input", None, "Input text file; default stdin.")
flags_lib.define_once(flags.DEFINE_string, "output", None, "Output file; default stdout.")
flags_lib.define_once(flags.DEFINE_string, "plot_attention", None,
                      "Write attention heat maps of the first line to this PNG.")
FLAGS = flags.FLAGS



def make_translator():
    """The Translator of --model_dir / --checkpoint with the decoding flags applied."""
    from tf_transformer.config import Config
    from tf_transformer.decoding.translator import Translator

    if not FLAGS.model_dir:
        raise app.UsageError("--model_dir is required")
    decode = Config.load(FLAGS.model_dir).decode
    decode = decode.with_overrides(flags_lib.decode_overrides())
    return Translator.from_model_dir(FLAGS.model_dir, FLAGS.checkpoint, decode), decode


def _warn(line_numbers, what):
    if line_numbers:
        shown = ", ".join(map(str, line_numbers[:10])) + (" ..." if len(line_numbers) > 10 else "")
        logging.warning("%d input lines (0-based: %s): %s", len(line_numbers), shown, what)


def main(argv):
    del argv
    from tf_transformer.decoding.translator import split_lines, translate_sentences

    translator, decode = make_translator()
    if FLAGS.input:
        with open(FLAGS.input, "rb") as f:
            lines, replaced = split_lines(f.read())
    else:
        lines, replaced = split_lines(sys.stdin.buffer.read())
    _warn(replaced, "invalid UTF-8 bytes replaced by U+FFFD")
    _warn([n for n, line in enumerate(lines) if not line.strip()], "empty, translated as empty")
    nbest_format = FLAGS.nbest is not None
    results = translate_sentences(translator, lines, decode.batch_size, nbest=nbest_format)
    limit = translator.max_source_length - 1
    _warn([n for n, r in enumerate(results) if r.source_tokens > limit],
          f"over {limit} tokens, truncated (the model's maximum source length)")
    out = open(FLAGS.output, "w", encoding="utf-8") if FLAGS.output else sys.stdout
    try:
        for n, result in enumerate(results):
            texts = [t.replace("\n", " ").replace("\r", " ") for t in result.texts]
            if nbest_format:
                for text, score in zip(texts, result.scores):
                    out.write(f"{n}\t{score:.6f}\t{text}\n")
            else:
                out.write(texts[0] + "\n")
    finally:
        if out is not sys.stdout:
            out.close()
        else:
            out.flush()
    if FLAGS.plot_attention and lines:
        from tf_transformer.decoding import attention_plot
        attention_plot.plot_translation(translator, lines[0], FLAGS.plot_attention)
        logging.info("attention of input line 0 written to %s", FLAGS.plot_attention)


if __name__ == "__main__":
    app.run(main)
