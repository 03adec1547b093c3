"""Training throughput and model FLOPs utilisation (MFU) on this machine.

  python -m bench.train_throughput [--presets=tiny,small,base] [--dtypes=float32,mixed_bfloat16]
                                   [--xla=false,true] [--steps=5]

Prints the machine's measured matmul peak (float32 and bfloat16, the best of
several 2048^3 products through TensorFlow, in this same run), then one line
per setting: source+target tokens per second, ms per step, model TFLOPs per
second and MFU = model FLOPs/s / measured float32 matmul peak (also against
the bfloat16 peak for bfloat16 runs). Batches are fixed-shape [B, L] without
padding (L = --length, B = tokens_per_batch // L), so every position is a
real token; the step is the trainer's own distributed step function.

  python -m bench.train_throughput --corpus_dir=DIR --presets=small
      [--modes=bucketed,static_step] [--rounds=2] [--seconds=300]

Times the modes (timing.MODES: bucketed graph step, bucketed with --jit_compile,
static batches, static batches with the whole step compiled, packed rows, packed
rows with the whole step compiled) on DIR/train.tsv
(8000-piece vocabulary, or --vocab), alternating them --rounds times, --seconds
each, compilations included: real (non-pad) tokens per second, the same without
the steps that met a new batch shape, MFU of the padded shapes, XLA compilations
and the seconds of those first steps.
"""


from absl import app, flags

from bench import timing
from bench.timing import define_step_flags, matmul_peak, time_setting

flags.DEFINE_list("presets", ["tiny", "small", "base"], "Presets to time.")
flags.DEFINE_list("dtypes", ["float32", "mixed_bfloat16"], "Compute dtypes.")
flags.DEFINE_list("xla", ["false", "true"], "jit_compile settings.")
define_step_flags(5, "Timed steps per setting (after 2 warm-up steps).",
                  "Tokens per side per batch (base uses half).")
flags.DEFINE_integer("vocab_size", 8000, "Vocabulary size.")
flags.DEFINE_integer("threads", 0, "intra-op threads (0: TensorFlow's default).")
flags.DEFINE_integer("inter_threads", 0, "inter-op threads (0: TensorFlow's default).")
flags.DEFINE_string("corpus_dir", None, "Time the --modes on DIR/train.tsv instead.")
flags.DEFINE_string("vocab", None, "SentencePiece model for --corpus_dir (default: trained).")
flags.DEFINE_list("modes", ["bucketed", "static_step"], "Modes of --corpus_dir (timing.MODES).")
flags.DEFINE_integer("rounds", 2, "Alternations of the --modes.")
flags.DEFINE_float("seconds", 300, "Seconds per mode and round, compilations included.")
flags.adopt_module_key_flags(timing)  # --help lists the step flags too
FLAGS = flags.FLAGS



def main(argv):
    del argv
    import tensorflow as tf

    from tf_transformer.training import distribution

    distribution.set_threads(FLAGS.threads, FLAGS.inter_threads)
    peak32 = matmul_peak(tf.float32)
    if FLAGS.corpus_dir:
        return time_corpus_modes(peak32)
    peak16 = matmul_peak(tf.bfloat16)
    print(f"matmul_peak float32_gflops={peak32 / 1e9:.1f} bfloat16_gflops={peak16 / 1e9:.1f}")
    for preset in FLAGS.presets:
        for dtype in FLAGS.dtypes:
            for xla in FLAGS.xla:
                r = time_setting(preset, dtype, xla == "true", FLAGS.steps, FLAGS.length,
                                 FLAGS.tokens_per_batch, FLAGS.vocab_size)
                mfu = r["tflops"] * 1e12 / peak32
                extra = (f" mfu_vs_bf16_peak={r['tflops'] * 1e12 / peak16:.3f}"
                         if dtype == "mixed_bfloat16" else "")
                print(f"train preset={preset} dtype={dtype} xla={xla} batch={r['batch']} "
                      f"tokens_per_sec={r['tokens_per_sec']:.0f} ms_per_step={r['ms_per_step']:.0f} "
                      f"model_tflops={r['tflops']:.3f} mfu={mfu:.3f}{extra}", flush=True)


def time_corpus_modes(peak32):
    import os
    import tempfile

    from tf_transformer.inputs import corpus, tokenizer

    print(f"matmul_peak float32_gflops={peak32 / 1e9:.1f}")
    work_dir = tempfile.mkdtemp(prefix="train_modes_")
    vocab = FLAGS.vocab or os.path.join(work_dir, "vocab.model")
    if not FLAGS.vocab:
        tokenizer.train_sentencepiece(
            corpus.read_tsv(os.path.join(FLAGS.corpus_dir, "train.tsv")), 8000, vocab)
    runs = {}  # mode -> the trainer, iterator and shapes, kept warm across rounds
    for round_ in range(FLAGS.rounds):
        for preset in FLAGS.presets:
            for mode in FLAGS.modes:
                key = (preset, mode)
                if key not in runs:
                    runs[key] = timing.corpus_trainer(preset, mode, FLAGS.corpus_dir, vocab,
                                                      FLAGS.tokens_per_batch, work_dir)
                r = timing.time_mode(*runs[key], FLAGS.seconds)
                print(f"train_mode round={round_} preset={preset} mode={mode} steps={r['steps']} "
                      f"tokens_per_sec={r['tokens_per_sec']:.0f} "
                      f"steady_tokens_per_sec={r['steady_tokens_per_sec']:.0f} "
                      f"mfu={r['flops_per_sec'] / peak32:.3f} shapes={r['shapes']} "
                      f"new_shapes={r['new_shapes']} "
                      f"xla_compiles={r['xla_compiles']} "
                      f"new_shape_seconds={r['new_shape_seconds']:.1f} loss={r['loss']:.3f}",
                      flush=True)


if __name__ == "__main__":
    app.run(main)
