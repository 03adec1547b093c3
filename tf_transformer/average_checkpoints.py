"""Averages the last N checkpoints (section 6.1): `--model_dir=DIR --num_last=N --output=DIR`.

The output is a model directory (config, vocabulary, one checkpoint) that
translate, evaluate and export accept.
"""

from absl import app, flags

from tf_transformer import flags as flags_lib

flags_lib.define_model_dir_flags()
flags.DEFINE_integer("num_last", None,
                     "Checkpoints to average; default: config.json's train.average_last.",
                     lower_bound=1)
flags.DEFINE_string("output", None, "Directory for the averaged model; required.")
flags.mark_flags_as_required(["model_dir", "output"])
flags.adopt_module_key_flags(flags_lib)
FLAGS = flags.FLAGS


def main(argv):
    del argv
    from tf_transformer.config import Config
    from tf_transformer.model import build_model
    from tf_transformer.training import checkpoints

    num_last = FLAGS.num_last or Config.load(FLAGS.model_dir).train.average_last
    path = checkpoints.write_averaged(FLAGS.model_dir, num_last, FLAGS.output, build_model)
    print(f"averaged last {num_last} checkpoints of {FLAGS.model_dir} into {path}")


if __name__ == "__main__":
    app.run(main)
