"""Exports a model directory as a TF Serving SavedModel: `python -m export`.

  python -m export --model_dir=DIR --export_dir=EXPORT_DIR \
      [--checkpoint=PATH | --average_last=N] [--beam_size=4 --alpha=0.6 --extra_length=50]
  python -m export --format=ctranslate2 --model_dir=DIR --export_dir=OUT \
      [--checkpoint=PATH | --average_last=N] [--quantization=int8]

Writes EXPORT_DIR/<version>/ (the next integer version, never reused, renamed
into place when complete) with the SentencePiece model and export_metadata.json
as assets and TF Serving warmup requests in assets.extra/. Decoding flags
default to the model directory's config.json; --nbest (the translate_nbest
signature's list length) defaults to the beam size. Prints the version path.
With --format=ctranslate2 it writes the same weights in CTranslate2's format
into OUT (unversioned) through CTranslate2's converter API (the optional
`ctranslate2` package). BUILD.md, "Export and serving", describes both.
"""

import os

from absl import app, flags

from tf_transformer import flags as flags_lib

flags_lib.define_model_dir_flags()
flags_lib.define_decode_flags()
flags_lib.define_once(flags.DEFINE_string, "export_dir", None,
                      "Base directory of the versions (TF Serving's model_base_path).")
flags_lib.define_once(flags.DEFINE_integer, "average_last", None,
                      "Average the last N checkpoints of --model_dir in memory.")
flags_lib.define_once(flags.DEFINE_string, "warmup_sentences",
                      os.path.join(os.path.dirname(os.path.abspath(__file__)), "serving",
                                   "warmup_sentences.txt"),
                      "Sentences for assets.extra/tf_serving_warmup_requests ('' for none).")
flags_lib.define_once(flags.DEFINE_string, "model_name", "transformer",
                      "model_spec.name written into the warmup requests.")
flags_lib.define_once(flags.DEFINE_string, "format", "saved_model",
                      "saved_model (TF Serving layout) or ctranslate2.")
flags_lib.define_once(flags.DEFINE_string, "quantization", None,
                      "ctranslate2 only: int8, int8_float32, int16, float16 or bfloat16.")
FLAGS = flags.FLAGS


def main(argv):
    del argv
    from tf_transformer.config import Config
    from tf_transformer.exporters import saved_model, warmup
    from tf_transformer.training import checkpoints

    if not FLAGS.model_dir or not FLAGS.export_dir:
        raise app.UsageError("--model_dir and --export_dir are required")
    if FLAGS.checkpoint and FLAGS.average_last:
        raise app.UsageError("give --checkpoint or --average_last, not both")
    if FLAGS.format not in ("saved_model", "ctranslate2"):
        raise app.UsageError(f"--format must be saved_model or ctranslate2, not {FLAGS.format!r}")
    if FLAGS.format == "ctranslate2":
        from tf_transformer.exporters import ctranslate2 as ctranslate2_export
        print(ctranslate2_export.run_export(FLAGS.model_dir, FLAGS.export_dir, FLAGS.checkpoint,
                                            FLAGS.average_last, FLAGS.quantization))
        return
    config = Config.load(FLAGS.model_dir)
    overrides = flags_lib.decode_overrides()
    overrides.pop("batch_size", None)
    decode = config.decode.with_overrides(overrides, all_beams=True)
    translator, used = saved_model.load_translator(
        FLAGS.model_dir, decode, FLAGS.checkpoint, FLAGS.average_last or 0)
    sentences = (warmup.read_sentences(FLAGS.warmup_sentences)
                 if FLAGS.warmup_sentences else [])
    metadata = {
        "model_dir": os.path.abspath(FLAGS.model_dir),
        "checkpoints": [os.path.abspath(p) for p in used],
        "averaged": len(used) if FLAGS.average_last else 0,
        "config": json_config(config),
    }
    path = saved_model.export(
        translator, FLAGS.export_dir, os.path.join(FLAGS.model_dir, checkpoints.VOCAB_FILE),
        metadata, sentences, FLAGS.model_name)
    print(path)


def json_config(config):
    import json
    return json.loads(config.to_json())


if __name__ == "__main__":
    app.run(main)
