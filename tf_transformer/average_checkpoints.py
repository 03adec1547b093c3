"""Averages checkpoints (section 6.1): `--model_dir=DIR --num_last=N --output=DIR`.

--num_best=N averages the N best by dev score (MODEL_DIR/best/, kept by training
with --dev_data) instead of the last N. The output is a model directory
(config, vocabulary, one checkpoint) that translate, evaluate and export accept.
"""

from absl import app, flags

from tf_transformer import flags as flags_lib
from tf_transformer import process_defaults

flags_lib.define_model_dir_flags()
flags.DEFINE_integer("num_last", None,
                     "Checkpoints to average; default: config.json's train.average_last.",
                     lower_bound=1)
flags.DEFINE_integer("num_best", None,
                     "Average the N best checkpoints of MODEL_DIR/best/ instead of the last; "
                     "default: not.", lower_bound=1)
flags.DEFINE_string("output", None, "Directory for the averaged model; required.")
flags.mark_flags_as_required(["model_dir", "output"])
flags.adopt_module_key_flags(flags_lib)
FLAGS = flags.FLAGS


def main(argv):
    del argv
    process_defaults.apply()  # before TensorFlow's import
    if FLAGS.num_last and FLAGS.num_best:
        raise app.UsageError("give --num_last or --num_best, not both")
    from tf_transformer.model import build_model
    from tf_transformer.model_dir import BEST, ModelDir, write_averaged

    model_dir = ModelDir(FLAGS.model_dir)
    config = model_dir.read_config()  # the one read: the model is built from it
    if FLAGS.num_best:
        number, which, checkpoint = FLAGS.num_best, "best", BEST
    else:
        number = FLAGS.num_last or config.train.average_last
        which, checkpoint = "last", None
    path = write_averaged(model_dir, number, ModelDir(FLAGS.output), build_model, checkpoint,
                          config)
    print(f"averaged {which} {number} checkpoints of {FLAGS.model_dir} into {path}")


def run():
    """`python -m` and the `tf-transformer-average` command (pyproject.toml): main, then a quick exit."""
    flags_lib.run_binary(main, __name__)


if __name__ == "__main__":
    run()
