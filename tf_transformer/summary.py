"""Builds a preset and prints its layers and parameter count (`make demo`, step one)."""

from absl import flags

from tf_transformer import flags as flags_lib
from tf_transformer import presets, process_defaults

flags.DEFINE_string("preset", "tiny", "Preset name (python -m tf_transformer.presets lists them).")
flags.DEFINE_integer("vocab_size", None, "Vocabulary size; default: the preset's.")
FLAGS = flags.FLAGS


def main(argv):
    del argv
    process_defaults.apply()  # before TensorFlow's import
    from tf_transformer.model import build_model  # TensorFlow after the flags (fast --help)

    config = presets.get_preset(FLAGS.preset, FLAGS.vocab_size)
    model = build_model(config.model)
    model.summary(expand_nested=False)
    print(config.to_json())
    print(f"params={model.count_params()} "
          f"closed_form={presets.closed_form_params(config.model)}")


if __name__ == "__main__":
    flags_lib.run_binary(main, __name__)
