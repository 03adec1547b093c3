"""What the training loop costs the host per step, with nothing for the device to do.

  python -m bench.host_overhead [--steps_per_call=8] [--steps=400] [--cpu_devices=0] [--jit_compile]

A model of negligible compute (1+1 layers, d_model 8, 16 tokens of vocabulary,
batches of 2x4 tokens) trains through the real Trainer.train loop, once with one
step per tf.function call and once with --steps_per_call steps per call. Its
ms_per_step is then the host's work per step: Python, the loop's calls, the
executor's launches and the input's dequeue (here the CPU also runs the tiny
model's ops); a shorter device step waits on the host. Each setting trains --steps steps
three times (a log line, hence one read of the device, each) after one window
that traces; prints `steps_per_call=N host_ms_per_step=X` (the best window) and
every window.
"""

import tempfile
import time

from absl import app, flags

from tf_transformer import process_defaults

STEPS_PER_CALL = flags.DEFINE_integer("steps_per_call", 8, "Steps per call to compare with 1.")
STEPS = flags.DEFINE_integer("steps", 400, "Steps per measured window.")
CPU_DEVICES = flags.DEFINE_integer("cpu_devices", 0,
                                   "Split the CPU into N logical devices (mirrored replicas).")
JIT_COMPILE = flags.DEFINE_bool("jit_compile", False,
                                "Each replica's pass as one XLA function (--jit_compile).")


def host_ms_per_step(steps_per_call: int, steps: int, strategy, jit_compile=False) -> list[float]:
    """Milliseconds per step of each window after the first (which traces), from one
    log line (one read of the device) to the next."""
    import numpy as np
    import tensorflow as tf

    from tf_transformer.config import Config, ModelConfig, TrainConfig
    from tf_transformer.training.trainer import Trainer

    model = ModelConfig(vocab_size=16, num_layers=1, d_model=8, d_ff=8, num_heads=1, dropout=0.0)
    train = TrainConfig(warmup_steps=10, log_every=steps, checkpoint_minutes=1e9,
                        divergence_steps=0, steps_per_call=steps_per_call,
                        jit_compile=jit_compile)
    trainer = Trainer(Config(model=model, train=train), tempfile.mkdtemp(), strategy)
    batch = {"source": np.array([[4, 5, 6, 3], [7, 8, 3, 0]], np.int32),
             "target_in": np.array([[2, 9, 10, 11], [2, 12, 13, 0]], np.int32),
             "target_out": np.array([[9, 10, 11, 3], [12, 13, 3, 0]], np.int32)}
    times = []  # when each window's log line is written (after its one read)
    trainer.train(lambda start_step: lambda context: tf.data.Dataset.from_tensors(batch).repeat(),
                  max_steps=4 * steps, log_fn=lambda line: times.append(time.perf_counter()))
    return [1000 * (b - a) / steps for a, b in zip(times, times[1:])]


def main(argv):
    del argv
    process_defaults.apply()
    from tf_transformer.training import distribution

    distribution.split_cpu(CPU_DEVICES.value)
    strategy = distribution.make_strategy("auto", CPU_DEVICES.value)
    for n in (1, STEPS_PER_CALL.value):
        windows = host_ms_per_step(n, STEPS.value, strategy, JIT_COMPILE.value)
        print(f"steps_per_call={n} host_ms_per_step={min(windows):.3f} "
              f"replicas={strategy.num_replicas_in_sync} jit_compile={JIT_COMPILE.value} "
              f"windows_ms={','.join(f'{w:.3f}' for w in windows)}", flush=True)


if __name__ == "__main__":
    app.run(main)
