"""Shared timing helpers of the benchmarks: the machine's matmul peak, a training step,
the op statistics of a profiler trace."""

import dataclasses
import glob
import json
import time


def define_step_flags(steps: int, steps_help: str, tokens_help: str) -> None:
    """The synthetic training batch of the step benchmarks: --length, --tokens_per_batch, --steps."""
    from absl import flags

    flags.DEFINE_integer("length", 48, "Tokens per sentence, each side.")
    flags.DEFINE_integer("tokens_per_batch", 4096, tokens_help)
    flags.DEFINE_integer("steps", steps, steps_help)


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


@dataclasses.dataclass
class StepUnderTest:
    run: object  # () -> float loss, one optimizer step
    model_flops: int
    tokens: int  # source + target tokens per step
    batch: str


def make_step(preset, dtype, xla, length, tokens_per_batch, vocab_size,
              compile_step=False) -> StepUnderTest:
    """The trainer's own step on a fixed [B, length] batch without padding, warmed up
    (`compile_step`: the whole step as one XLA program, TrainConfig.compile_step)."""
    import numpy as np
    import tensorflow as tf

    from tf_transformer import presets
    from tf_transformer.model import flops
    from tf_transformer.training.trainer import Trainer

    config = presets.get_preset(preset, vocab_size)
    config = config.replace(train=dataclasses.replace(
        config.train, dtype=dtype, jit_compile=xla, compile_step=compile_step,
        log_every=10 ** 9))
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    trainer = Trainer(config, f"/tmp/bench_train_{preset}", strategy)
    batch_size = tokens_per_batch // length
    rng = np.random.default_rng(0)
    batch = {k: tf.constant(rng.integers(4, vocab_size, size=(batch_size, length)), tf.int32)
             for k in ("source", "target_in", "target_out")}
    iterator = iter(strategy.distribute_datasets_from_function(
        lambda ctx: tf.data.Dataset.from_tensors(batch).repeat()))
    step_fn = trainer.step_fn()

    def run():
        return float(step_fn(iterator)["loss"])

    for _ in range(2):
        run()
    return StepUnderTest(run, flops.train_step_flops(config.model, batch_size, length, length),
                         2 * batch_size * length, f"{batch_size}x{length}")


def time_setting(preset, dtype, xla, steps, length, tokens_per_batch, vocab_size):
    if preset == "base":
        tokens_per_batch //= 2
    step = make_step(preset, dtype, xla, length, tokens_per_batch, vocab_size)
    start = time.perf_counter()
    for _ in range(steps):
        step.run()
    seconds = (time.perf_counter() - start) / steps
    return {"tokens_per_sec": step.tokens / seconds, "ms_per_step": 1000 * seconds,
            "tflops": step.model_flops / seconds / 1e12, "batch": step.batch}


def op_stats(logdir: str) -> list[dict]:
    """Per-op rows (type, operation, total_self_time, ...) of the profiler trace
    in `logdir`, host side. Needs the `xprof` package (not a runtime dependency)."""
    from xprof.convert import raw_to_tool_data

    paths = glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)
    data, _ = raw_to_tool_data.xspace_to_tool_data(paths, "framework_op_stats", {})
    table = json.loads(data)[0]  # the host table
    columns = [c["id"] for c in table["cols"]]
    return [dict(zip(columns, [cell.get("v") for cell in row["c"]])) for row in table["rows"]]


def xla_op_times(logdir: str) -> dict[str, float]:
    """Milliseconds per executed HLO op (fusion, dot, gather...) summed over the
    trace in `logdir`, which the framework op table, seeing one XLA launch, does
    not show. Needs XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true; XLA:CPU runs
    its ops on the intra-op ("Eigen") threads, beside scaffolding named "A::B"."""
    try:
        from tsl.profiler.protobuf import xplane_pb2
    except ImportError:
        from tensorflow.tsl.profiler.protobuf import xplane_pb2
    totals: dict[str, float] = {}
    for path in glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True):
        space = xplane_pb2.XSpace()
        with open(path, "rb") as f:
            space.ParseFromString(f.read())
        for plane in space.planes:
            names = {k: v.name for k, v in plane.event_metadata.items()}
            for line in plane.lines:
                if "Eigen" not in line.name:
                    continue
                for event in line.events:
                    name = names.get(event.metadata_id, "?")
                    if "::" not in name:
                        totals[name] = totals.get(name, 0.0) + event.duration_ps / 1e9
    return totals


# name -> (DataConfig.static_batch, DataConfig.packing, TrainConfig.jit_compile,
#          TrainConfig.compile_step)
MODES = {"bucketed": (False, False, False, False), "bucketed_xla": (False, False, True, False),
         "static": (True, False, False, False), "static_step": (True, False, False, True),
         "packed": (False, True, False, False), "packed_step": (False, True, False, True)}


def corpus_trainer(preset, mode, corpus_dir, vocab_path, tokens_per_batch, work_dir):
    """(Trainer, iterator, shapes, seen): the trainer's own step on the corpus's training
    batches in `mode` (MODES); `shapes` records each batch's [B, L] as the step pulls it,
    `seen` (empty) the shapes already met, across time_mode calls."""
    import os

    import tensorflow as tf

    from tf_transformer import presets
    from tf_transformer.inputs import corpus, packing, pipeline, tokenizer
    from tf_transformer.training.trainer import Trainer

    static, packed, jit, whole = MODES[mode]
    tok = tokenizer.Tokenizer(vocab_path)
    config = presets.get_preset(preset, tok.vocab_size)
    config = config.replace(
        data=dataclasses.replace(config.data, static_batch=static, packing=packed,
                                 tokens_per_batch=tokens_per_batch),
        train=dataclasses.replace(config.train, jit_compile=jit, compile_step=whole,
                                  log_every=10 ** 9))
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
    trainer = Trainer(config, os.path.join(work_dir, mode), tf.distribute.OneDeviceStrategy("/cpu:0"))
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
