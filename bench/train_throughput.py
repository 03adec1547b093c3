"""Training throughput and model FLOPs utilisation (MFU) on this machine.

  python -m bench.train_throughput [--presets=tiny,small,base] [--dtypes=float32,mixed_bfloat16]
                                   [--xla=false,true] [--steps=5]

Prints the machine's measured matmul peak (float32 and bfloat16, the best of
several 2048^3 products through TensorFlow, in this same run), then one line
per setting: source+target tokens per second, ms per step, model TFLOPs per
second and MFU = model FLOPs/s / measured float32 matmul peak (also against
the bfloat16 peak for bfloat16 runs). Batches are fixed-shape [B, 48] of an 8000-piece
vocabulary without padding (B = 4096 tokens // 48, half that for base), so every position
is a real token; the step is the trainer's own distributed step function.
"""

import dataclasses
import itertools
import time

from absl import app, flags

from bench.timing import matmul_peak
from tf_transformer import process_defaults

flags.DEFINE_list("presets", ["tiny", "small", "base"], "Presets to time.")
flags.DEFINE_list("dtypes", ["float32", "mixed_bfloat16"], "Compute dtypes.")
flags.DEFINE_list("xla", ["false", "true"], "jit_compile settings.")
flags.DEFINE_integer("steps", 5, "Timed steps per setting (after 2 warm-up steps).")
FLAGS = flags.FLAGS
LENGTH, TOKENS_PER_BATCH, VOCAB_SIZE = 48, 4096, 8000  # a sentence, a batch (per side)


def time_setting(preset, dtype, xla, steps) -> dict:
    """The trainer's own step on a fixed [B, LENGTH] batch without padding: two warm-up
    steps, then `steps` timed; tokens/s, ms per step, model TFLOP/s and the batch."""
    import numpy as np
    import tensorflow as tf

    from tf_transformer import presets
    from tf_transformer.model import flops
    from tf_transformer.training.trainer import Trainer

    config = presets.get_preset(preset, VOCAB_SIZE)
    config = config.replace(train=dataclasses.replace(
        config.train, log_every=10 ** 9, dtype=dtype, jit_compile=xla))
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    trainer = Trainer(config, f"/tmp/bench_train_{preset}", strategy)
    batch_size = TOKENS_PER_BATCH // (2 if preset == "base" else 1) // LENGTH
    rng = np.random.default_rng(0)
    batch = {k: tf.constant(rng.integers(4, VOCAB_SIZE, size=(batch_size, LENGTH)), tf.int32)
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
    model_flops = flops.train_step_flops(config.model, batch_size, LENGTH, LENGTH)
    return {"tokens_per_sec": 2 * batch_size * LENGTH / seconds, "ms_per_step": 1000 * seconds,
            "tflops": model_flops / seconds / 1e12, "batch": f"{batch_size}x{LENGTH}"}


def main(argv):
    del argv
    process_defaults.apply()  # before TensorFlow's import: the binaries' kernels
    peak32, peak16 = matmul_peak("float32"), matmul_peak("bfloat16")
    print(f"matmul_peak float32_gflops={peak32 / 1e9:.1f} bfloat16_gflops={peak16 / 1e9:.1f}")
    for preset, dtype, xla in itertools.product(FLAGS.presets, FLAGS.dtypes, FLAGS.xla):
        r = time_setting(preset, dtype, xla == "true", FLAGS.steps)
        mfu = r["tflops"] * 1e12 / peak32
        extra = (f" mfu_vs_bf16_peak={r['tflops'] * 1e12 / peak16:.3f}"
                 if dtype == "mixed_bfloat16" else "")
        print(f"train preset={preset} dtype={dtype} xla={xla} batch={r['batch']} "
              f"tokens_per_sec={r['tokens_per_sec']:.0f} ms_per_step={r['ms_per_step']:.0f} "
              f"model_tflops={r['tflops']:.3f} mfu={mfu:.3f}{extra}", flush=True)


if __name__ == "__main__":
    app.run(main)
