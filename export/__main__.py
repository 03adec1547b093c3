"""Exports a model directory as a TF Serving SavedModel: `python -m export`.

  python -m export --model_dir=DIR --export_dir=EXPORT_DIR \
      [--checkpoint=PATH | --average_last=N] [--beam_size=4 --alpha=0.6 --extra_length=50]
      [--signatures=serving_default,tokenize,...]
  python -m export --format=ctranslate2 --model_dir=DIR --export_dir=OUT \
      [--checkpoint=PATH | --average_last=N] [--quantization=int8]

Writes EXPORT_DIR/<version>/ (the next integer version, never reused, renamed
into place when complete) with the SentencePiece model and export_metadata.json
as assets and TF Serving warmup requests in assets.extra/. Decoding flags
default to the model directory's config.json; --nbest (the translate_nbest
signature's list length) defaults to the beam size. Prints the version path.
With --format=ctranslate2 it writes the same weights in CTranslate2's format
into OUT (unversioned) through CTranslate2's converter API (the optional
`ctranslate2` package). export/serving/README.md describes both.
"""

import os

from absl import app, flags

from tf_transformer import flags as flags_lib
from tf_transformer import process_defaults

flags_lib.define_restore_flags()
flags_lib.define_decode_flags(
    nbest_help="List length of the translate_nbest signature (<= beam_size); default: the beam.",
    batch_size=False)
flags.FLAGS.set_default("bounded_shapes", True)  # a server's searches: a fixed set of shapes
flags.DEFINE_string("export_dir", None,
                    "Base directory of the versions (TF Serving's model_base_path); required.")
flags.DEFINE_string("warmup_sentences",
                    os.path.join(os.path.dirname(os.path.abspath(__file__)), "serving",
                                 "warmup_sentences.txt"),
                    "Sentences for assets.extra/tf_serving_warmup_requests ('' for none).")
flags.DEFINE_string("model_name", "transformer",
                    "model_spec.name written into the warmup requests.")
flags.DEFINE_list("signatures", None,
                  "The signatures to export (serving_default always among them), e.g. "
                  "serving_default,tokenize: only theirs are traced, saved and loaded; "
                  "default: every signature (export/serving/README.md).")
flags.DEFINE_enum("format", "saved_model", ["saved_model", "ctranslate2"],
                  "saved_model (TF Serving layout) or ctranslate2.")
flags.DEFINE_string("quantization", None,
                    "ctranslate2 only: int8, int8_float32, int16, float16 or bfloat16; "
                    "default: the weights' float32.")
flags.adopt_module_key_flags(flags_lib)
FLAGS = flags.FLAGS


def main(argv):
    del argv
    process_defaults.apply()  # before TensorFlow's import
    flags_lib.check_restore_flags()
    if not FLAGS.export_dir:
        raise app.UsageError("--export_dir is required")
    from tf_transformer.model_dir import ModelDir
    model_dir = ModelDir(FLAGS.model_dir)
    if FLAGS.format == "ctranslate2":
        from tf_transformer.exporters import ctranslate2 as ctranslate2_export
        print(ctranslate2_export.run_export(model_dir, FLAGS.export_dir, FLAGS.checkpoint,
                                            FLAGS.average_last, FLAGS.quantization))
        return
    from tf_transformer.exporters import saved_model, warmup
    try:
        signature_names = saved_model.chosen_signatures(FLAGS.signatures)
    except ValueError as error:
        raise app.UsageError(f"--signatures: {error}")
    translator, _ = flags_lib.translator_from_flags(all_beams=True)
    used = translator.checkpoint_paths
    sentences = (warmup.read_sentences(FLAGS.warmup_sentences)
                 if FLAGS.warmup_sentences else [])
    metadata = {
        "model_dir": os.path.abspath(FLAGS.model_dir),
        "checkpoints": [os.path.abspath(p) for p in used],
        "averaged": len(used) if FLAGS.average_last else 0,
        "config": json_config(translator.config),
    }
    path = saved_model.export(
        translator, FLAGS.export_dir, model_dir.vocab_paths(),
        metadata, sentences, FLAGS.model_name, signature_names)
    print(path)


def json_config(config):
    import json
    return json.loads(config.to_json())


def run():
    """`python -m` and the `tf-transformer-export` command (pyproject.toml): main, then a quick exit."""
    flags_lib.run_binary(main, __name__)


if __name__ == "__main__":
    run()
