"""Where a training step's time goes: an op-level profile of the trainer's step.

  python -m bench.profile_train_step [--preset=small] [--dtype=float32] [--xla=false]
      [--compile_step=false]

Traces a few steps with the TensorFlow profiler and prints the ops that take
the most self time, grouped by op type, with their share of the total, plus
the step time. With --compile_step (the whole step one XLA program) the
framework sees one launch, so the HLO ops inside it are listed instead. Needs
the `xprof` package to read the trace (pip install xprof; it is not a runtime
dependency).
"""

import collections
import os
import re
import tempfile
import time

from absl import app, flags

from bench import timing
from bench.timing import define_step_flags

flags.DEFINE_string("preset", "small", "Preset.")
flags.DEFINE_string("dtype", "float32", "float32 or mixed_bfloat16.")
flags.DEFINE_bool("xla", False, "jit_compile the forward/backward pass.")
flags.DEFINE_bool("compile_step", False, "The whole step (optimizer included) as one XLA program.")
define_step_flags(3, "Profiled steps.", "Tokens per side per batch.")
flags.DEFINE_integer("top", 25, "Op rows to print.")
flags.adopt_module_key_flags(timing)  # --help lists the step flags too
FLAGS = flags.FLAGS


def main(argv):
    del argv
    if FLAGS.compile_step:  # XLA's per-HLO trace events (read when the first compile starts)
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + " --xla_cpu_enable_xprof_traceme=true")
    import tensorflow as tf

    from bench.timing import make_step, matmul_peak, op_stats, xla_op_times

    peak = matmul_peak(tf.float32)
    logdir = tempfile.mkdtemp(prefix="profile_")
    step = make_step(FLAGS.preset, FLAGS.dtype, FLAGS.xla, FLAGS.length,
                     FLAGS.tokens_per_batch, 8000,  # traced and warmed up outside the profile
                     compile_step=FLAGS.compile_step)
    tf.profiler.experimental.start(logdir)
    start = time.perf_counter()
    for _ in range(FLAGS.steps):
        step.run()
    seconds = (time.perf_counter() - start) / FLAGS.steps
    tf.profiler.experimental.stop()
    print(f"step preset={FLAGS.preset} dtype={FLAGS.dtype} xla={FLAGS.xla} "
          f"compile_step={FLAGS.compile_step} batch={step.batch} "
          f"ms_per_step={1000 * seconds:.0f} tokens_per_sec={step.tokens / seconds:.0f} "
          f"mfu={step.model_flops / seconds / peak:.3f} peak_gflops={peak / 1e9:.1f}")
    if FLAGS.compile_step:
        totals = collections.Counter()
        for name, ms in xla_op_times(logdir).items():  # fusion.12 -> fusion
            totals[re.sub(r"([._]\d+)+$", "", name)] += ms
        total = sum(totals.values())
        print(f"by HLO op (share of {total:.0f} ms of HLO time over {FLAGS.steps} steps; "
              "dot: the matrix products)")
        for name, ms in totals.most_common(FLAGS.top):
            print(f"  {name[:60]:60s} {ms / total:6.1%} {ms / FLAGS.steps:8.1f} ms/step")
        return
    rows = op_stats(logdir)
    by_type = collections.Counter()
    for row in rows:
        by_type[row.get("type", "?")] += float(row.get("total_self_time", 0) or 0)
    total = sum(by_type.values())
    print(f"profile total_self_time_us={total:.0f} over {FLAGS.steps} steps (IDLE: executor threads waiting)")
    for op_type, micros in by_type.most_common(FLAGS.top):
        print(f"  {op_type:40s} {micros / total:6.1%}")


if __name__ == "__main__":
    app.run(main)
