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
"""

import time

from absl import app, flags

flags.DEFINE_list("presets", ["tiny", "small", "base"], "Presets to time.")
flags.DEFINE_list("dtypes", ["float32", "mixed_bfloat16"], "Compute dtypes.")
flags.DEFINE_list("xla", ["false", "true"], "jit_compile settings.")
flags.DEFINE_integer("steps", 5, "Timed steps per setting (after 2 warm-up steps).")
flags.DEFINE_integer("length", 48, "Tokens per sentence, each side.")
flags.DEFINE_integer("tokens_per_batch", 4096, "Tokens per side per batch (base uses half).")
flags.DEFINE_integer("vocab_size", 8000, "Vocabulary size.")
flags.DEFINE_integer("threads", 0, "intra-op threads (0: TensorFlow's default).")
FLAGS = flags.FLAGS


def matmul_peak(dtype, size=2048, repeats=8) -> float:
    """Best-of-N FLOP/s of a size^3 matmul through TensorFlow."""
    import tensorflow as tf

    a = tf.cast(tf.random.normal([size, size]), dtype)
    b = tf.cast(tf.random.normal([size, size]), dtype)
    matmul = tf.function(tf.matmul)
    matmul(a, b).numpy()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(a, b).numpy()
        best = min(best, time.perf_counter() - start)
    return 2 * size ** 3 / best


def time_setting(preset, dtype, xla, steps, length, tokens_per_batch, vocab_size):
    import dataclasses

    import numpy as np
    import tensorflow as tf

    from tf_transformer import flops, presets
    from tf_transformer.trainer import Trainer

    config = presets.get_preset(preset, vocab_size)
    if preset == "base":
        tokens_per_batch //= 2
    config = config.replace(train=dataclasses.replace(
        config.train, dtype=dtype, jit_compile=xla, log_every=10 ** 9))
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    trainer = Trainer(config, f"/tmp/bench_train_{preset}", strategy)
    batch_size = tokens_per_batch // length
    rng = np.random.default_rng(0)
    batch = {k: tf.constant(rng.integers(4, vocab_size, size=(batch_size, length)), tf.int32)
             for k in ("source", "target_in", "target_out")}
    iterator = iter(strategy.distribute_datasets_from_function(
        lambda ctx: tf.data.Dataset.from_tensors(batch).repeat()))
    step = trainer.step_fn()
    for _ in range(2):
        float(step(iterator)["loss"])
    start = time.perf_counter()
    for _ in range(steps):
        float(step(iterator)["loss"])
    seconds = (time.perf_counter() - start) / steps
    model_flops = flops.train_step_flops(config.model, batch_size, length, length)
    return {"tokens_per_sec": 2 * batch_size * length / seconds, "ms_per_step": 1000 * seconds,
            "tflops": model_flops / seconds / 1e12, "batch": f"{batch_size}x{length}"}


def main(argv):
    del argv
    import tensorflow as tf

    if FLAGS.threads:
        tf.config.threading.set_intra_op_parallelism_threads(FLAGS.threads)
    peak32 = matmul_peak(tf.float32)
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


if __name__ == "__main__":
    app.run(main)
