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

import dataclasses
import time

from absl import app, flags

from bench.timing import matmul_peak

flags.DEFINE_list("presets", ["tiny", "small", "base"], "Presets to time.")
flags.DEFINE_list("dtypes", ["float32", "mixed_bfloat16"], "Compute dtypes.")
flags.DEFINE_list("xla", ["false", "true"], "jit_compile settings.")
flags.DEFINE_integer("length", 48, "Tokens per sentence, each side.")
flags.DEFINE_integer("tokens_per_batch", 4096, "Tokens per side per batch (base uses half).")
flags.DEFINE_integer("steps", 5, "Timed steps per setting (after 2 warm-up steps).")
flags.DEFINE_integer("vocab_size", 8000, "Vocabulary size.")
FLAGS = flags.FLAGS


def time_setting(preset, dtype, xla, steps, length, tokens_per_batch, vocab_size) -> dict:
    """The trainer's own step on a fixed [B, length] batch without padding: two warm-up
    steps, then `steps` timed; tokens/s, ms per step, model TFLOP/s and the batch."""
    import numpy as np
    import tensorflow as tf

    from tf_transformer import presets
    from tf_transformer.model import flops
    from tf_transformer.training.trainer import Trainer

    if preset == "base":
        tokens_per_batch //= 2
    config = presets.get_preset(preset, vocab_size)
    config = config.replace(train=dataclasses.replace(
        config.train, log_every=10 ** 9, dtype=dtype, jit_compile=xla))
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    trainer = Trainer(config, f"/tmp/bench_train_{preset}", strategy)
    batch_size = tokens_per_batch // length
    rng = np.random.default_rng(0)
    batch = {k: tf.constant(rng.integers(4, vocab_size, size=(batch_size, length)), tf.int32)
             for k in ("source", "target_in", "target_out")}
    iterator = iter(strategy.distribute_datasets_from_function(
        lambda ctx: tf.data.Dataset.from_tensors(batch).repeat()))
    step_fn = trainer.step_fn()
    for _ in range(2):
        float(step_fn(iterator)["loss"])
    start = time.perf_counter()
    for _ in range(steps):
        float(step_fn(iterator)["loss"])
    seconds = (time.perf_counter() - start) / steps
    model_flops = flops.train_step_flops(config.model, batch_size, length, length)
    return {"tokens_per_sec": 2 * batch_size * length / seconds, "ms_per_step": 1000 * seconds,
            "tflops": model_flops / seconds / 1e12, "batch": f"{batch_size}x{length}"}


def main(argv):
    del argv
    from tf_transformer import process_defaults

    process_defaults.apply()  # before TensorFlow's import: the binaries' kernels
    import tensorflow as tf

    peak32, peak16 = matmul_peak(tf.float32), matmul_peak(tf.bfloat16)
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
