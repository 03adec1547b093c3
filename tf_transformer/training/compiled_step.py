"""The whole replica step as one XLA program per batch shape (TrainConfig.compile_step).

Forward, backward, loss scaling, the (one-replica) all-reduce, the division by
the token count, the gradient norm and Keras's Adam update run in one
`jit_compile` function, so XLA fuses the op-by-op work around the GEMMs (layer
norms, dropout, Adam's ~11 element-wise ops per variable) and the step is one
launch. The batches are taken from the iterator in Python, so each call sees
concrete shapes: one trace, hence exactly one XLA compilation, per distinct
(accum, rows, length) shape; with `DataConfig.static_batch` that is at most
len(boundaries) for the whole run (`compiles` counts them).

One replica only. Under MirroredStrategy (logical CPUs or GPUs, TF 2.21) neither
the cross-replica all-reduce nor Keras's apply_gradients can run inside an XLA
function: the optimizer's update is a `merge_call` ("merge_call called while
defining a new graph"), and a jit function traced once for replica 0 reads
replica 1's variables from the wrong device. There `--jit_compile` (forward and
backward per replica) is the compiled path.
"""

from __future__ import annotations

import time

import tensorflow as tf

from tf_transformer.config import ConfigError


class CompiledStep:
    """Callable like Trainer.step_fn(): (iterator, flags=None) -> dict of float32 scalars."""

    def __init__(self, trainer):
        strategy = trainer.strategy
        if strategy.num_replicas_in_sync != 1:
            raise ConfigError(
                f"compile_step needs one replica, not {strategy.num_replicas_in_sync}: the "
                "all-reduce and Adam's update cannot run in XLA under MirroredStrategy; "
                "use --jit_compile (forward and backward compiled per replica)")
        self._accum = trainer.config.train.accum_steps
        self._replica = tf.function(trainer._replica_step, jit_compile=True)

        @tf.function  # no reduce_retracing: one trace per concrete shape
        def run(batches, flags):
            out = strategy.run(self._replica, args=(batches, flags))
            return {k: strategy.experimental_local_results(v)[0] for k, v in out.items()}

        self._run = run
        self.compile_seconds = 0.0  # trace + XLA compilation + that first step

    @property
    def compiles(self) -> int:
        """XLA programs built so far: one per distinct batch shape."""
        return self._replica.experimental_get_tracing_count()

    def __call__(self, iterator, flags=None):
        if flags is None:
            flags = tf.zeros([3])
        batches = tuple(next(iterator) for _ in range(self._accum))
        before, start = self.compiles, time.perf_counter()
        out = self._run(batches, flags)
        if self.compiles > before:
            out = {k: tf.identity(v) for k, v in out.items()}
            _ = out["loss"].numpy()  # the compilation runs at the first call
            self.compile_seconds += time.perf_counter() - start
        return out
