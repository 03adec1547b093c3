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

Times the modes (MODES: bucketed graph step, bucketed with --jit_compile,
static batches, static batches with the whole step compiled, packed rows, packed
rows with the whole step compiled) on DIR/train.tsv
(8000-piece vocabulary, or --vocab), alternating them --rounds times, --seconds
each, compilations included: real (non-pad) tokens per second, the same without
the steps that met a new batch shape, MFU of the padded shapes, XLA compilations
and the seconds of those first steps.
"""

import dataclasses
import os
import tempfile
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
flags.DEFINE_integer("threads", 0, "intra-op threads (0: TensorFlow's default).")
flags.DEFINE_integer("inter_threads", 0, "inter-op threads (0: TensorFlow's default).")
flags.DEFINE_string("corpus_dir", None, "Time the --modes on DIR/train.tsv instead.")
flags.DEFINE_string("vocab", None, "SentencePiece model for --corpus_dir (default: trained).")
flags.DEFINE_list("modes", ["bucketed", "static_step"], "Modes of --corpus_dir (MODES).")
flags.DEFINE_integer("rounds", 2, "Alternations of the --modes.")
flags.DEFINE_float("seconds", 300, "Seconds per mode and round, compilations included.")
FLAGS = flags.FLAGS

# name -> (DataConfig.static_batch, DataConfig.packing, TrainConfig.jit_compile,
#          TrainConfig.compile_step)
MODES = {"bucketed": (False, False, False, False), "bucketed_xla": (False, False, True, False),
         "static": (True, False, False, False), "static_step": (True, False, False, True),
         "packed": (False, True, False, False), "packed_step": (False, True, False, True)}


def _trainer(config, work_dir, strategy, **train):
    """The Trainer of `config` with the TrainConfig fields `train`, logging never."""
    from tf_transformer.training.trainer import Trainer

    config = config.replace(train=dataclasses.replace(config.train, log_every=10 ** 9, **train))
    return Trainer(config, work_dir, strategy)


def time_setting(preset, dtype, xla, steps, length, tokens_per_batch, vocab_size) -> dict:
    """The trainer's own step on a fixed [B, length] batch without padding: two warm-up
    steps, then `steps` timed; tokens/s, ms per step, model TFLOP/s and the batch."""
    import numpy as np
    import tensorflow as tf

    from tf_transformer import presets
    from tf_transformer.model import flops

    if preset == "base":
        tokens_per_batch //= 2
    config = presets.get_preset(preset, vocab_size)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    trainer = _trainer(config, f"/tmp/bench_train_{preset}", strategy, dtype=dtype, jit_compile=xla)
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


def corpus_trainer(preset, mode, corpus_dir, vocab_path, tokens_per_batch, work_dir):
    """(Trainer, iterator, shapes, seen): the trainer's own step on the corpus's training
    batches in `mode` (MODES); `shapes` records each batch's [B, L] as the step pulls it,
    `seen` (empty) the shapes already met, across time_mode calls."""
    import tensorflow as tf

    from tf_transformer import presets
    from tf_transformer.inputs import corpus, packing, pipeline, tokenizer

    static, packed, jit, whole = MODES[mode]
    tok = tokenizer.Tokenizer(vocab_path)
    config = presets.get_preset(preset, tok.vocab_size)
    config = config.replace(data=dataclasses.replace(
        config.data, static_batch=static, packing=packed, tokens_per_batch=tokens_per_batch))
    pairs = corpus.read_tsv(os.path.join(corpus_dir, "train.tsv"))
    if packed:
        dataset = packing.make_dataset(pairs, tok, config.data, count_skipped=False)
        keys = packing.PACKED_KEYS
    else:
        dataset = pipeline.make_dataset(pairs, tok, config.data, training=True,
                                        count_skipped=False)
        keys = pipeline.KEYS
    numpy_batches = dataset.as_numpy_iterator()
    shapes = []

    def generate():
        for batch in numpy_batches:
            shapes.append(batch["source"].shape)
            yield batch

    spec = {k: tf.TensorSpec([None, None], tf.int32) for k in keys}
    iterator = iter(tf.data.Dataset.from_generator(generate, output_signature=spec))
    trainer = _trainer(config, os.path.join(work_dir, mode), tf.distribute.OneDeviceStrategy("/cpu:0"),
                       jit_compile=jit, compile_step=whole)
    return trainer, iterator, shapes, set()


def time_mode(trainer, iterator, shapes, seen, seconds: float) -> dict:
    """Steps for `seconds` (compilations included): real (non-pad) source+target tokens
    per second, overall and without the steps that met a new batch shape (trace and XLA
    compilation: counted with their seconds), and model FLOP/s of the padded shapes."""
    step = trainer.step_fn()
    tokens, flops, steps, known = 0.0, 0.0, 0, len(seen)
    new_shape_seconds, steady_tokens = 0.0, 0.0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        before = time.perf_counter()
        out = {k: float(v) for k, v in step(iterator).items() if k != "flags"}
        spent = time.perf_counter() - before
        real = out["source_tokens"] + out["target_tokens"]
        tokens, flops, steps = tokens + real, flops + out["flops"], steps + 1
        if shapes[-1] in seen:
            steady_tokens += real
        else:
            seen.add(shapes[-1])
            new_shape_seconds += spent
    total = time.perf_counter() - start
    return {"steps": steps, "tokens_per_sec": tokens / total,
            "steady_tokens_per_sec": steady_tokens / max(total - new_shape_seconds, 1e-9),
            "flops_per_sec": flops / total, "shapes": len(seen), "new_shapes": len(seen) - known,
            "new_shape_seconds": new_shape_seconds,
            "xla_compiles": getattr(step, "compiles", len(seen) if trainer.config.train.jit_compile
                                    else 0), "loss": out["loss"]}


def main(argv):
    del argv
    from tf_transformer import process_defaults

    process_defaults.apply()  # before TensorFlow's import: the binaries' kernels
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
                    runs[key] = corpus_trainer(preset, mode, FLAGS.corpus_dir, vocab,
                                               FLAGS.tokens_per_batch, work_dir)
                r = time_mode(*runs[key], FLAGS.seconds)
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
