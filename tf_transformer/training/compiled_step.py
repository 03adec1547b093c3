"""The step under XLA: `ReplicaGrads` (--jit_compile) and `CompiledStep` (--compile_step).

Both receive the step (training/step.py: TrainStep) and call only its public methods.

`ReplicaGrads` compiles one micro-batch's forward and backward pass (loss,
token count, loss scaling) as one XLA function of (weights, batch, dropout key,
loss scale), the weights passed in as this replica's values (Keras's
`StatelessScope`) rather than captured: under MirroredStrategy TensorFlow traces
a function again for each replica's device, and a traced function captures
that replica's variables. Traced once, eagerly before the step (`prepare`), with
free batch dimensions, the one concrete function serves every replica; XLA compiles
it once per bucket shape on each device. No shape in it depends on the data
(every target position, pads weighted 0). The all-reduce and Adam's update stay
outside: under MirroredStrategy they are cross-device (`merge_call`).

The whole replica step as one XLA program per batch shape (TrainConfig.compile_step).

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

import keras
import tensorflow as tf

from tf_transformer.config import PAD_ID, ConfigError


class ReplicaGrads:
    """Callable like TrainStep.grads(batch, dropout_key) -> (grads, loss sum, tokens,
    source tokens), in replica context; one trace for every replica (`traces`)."""

    def __init__(self, step):
        self._step = step
        self._fn = tf.function(self._grads_of_values, autograph=False, jit_compile=True)
        self._concrete = None

    @property
    def traces(self) -> int:
        return self._fn.experimental_get_tracing_count()

    @property
    def graph(self) -> tf.Graph:
        """The traced function's graph (after `prepare`)."""
        return self._concrete.graph

    def _grads_of_values(self, values, batch, dropout_key, scale):
        step = self._step
        with tf.GradientTape() as tape:
            tape.watch(values)
            mapping = list(zip(step.model.trainable_variables, values))
            with keras.StatelessScope(state_mapping=mapping):
                objective, loss_sum, tokens = step.objective_sums(batch, dropout_key)
            scaled = objective * scale
        grads = tape.gradient(scaled, values)
        return [tf.convert_to_tensor(g) for g in grads], loss_sum, tokens

    def prepare(self, element_spec: dict) -> None:
        """Traces the function for batches of `element_spec` (any rows and length), once.

        Called eagerly, before the step function that calls this one is traced: the
        trace then holds no replica's device scope or variables."""
        if self._concrete is None:
            variables = self._step.model.trainable_variables
            self._concrete = self._fn.get_concrete_function(
                [tf.TensorSpec(v.shape, v.dtype) for v in variables],
                {k: tf.TensorSpec([None] * spec.shape.rank, spec.dtype)
                 for k, spec in element_spec.items()},
                tf.TensorSpec([], tf.int64), tf.TensorSpec([], tf.float32))

    def __call__(self, batch, dropout_key):
        step = self._step
        if self._concrete is None:
            raise RuntimeError("ReplicaGrads.prepare must trace it before the step is traced")
        values = [tf.convert_to_tensor(v) for v in step.model.trainable_variables]
        grads, loss_sum, tokens = self._concrete(values, batch, dropout_key,
                                                 step.loss_scale_factor())
        source_tokens = tf.reduce_sum(tf.cast(batch["source"] != PAD_ID, tf.float32))
        return grads, loss_sum, tokens, source_tokens


class CompiledStep:
    """Callable like TrainStep.step_fn(): (iterator, flags=None) -> dict of float32 scalars."""

    def __init__(self, step):
        strategy = step.strategy
        if strategy.num_replicas_in_sync != 1:
            raise ConfigError(
                f"compile_step needs one replica, not {strategy.num_replicas_in_sync}: the "
                "all-reduce and Adam's update cannot run in XLA under MirroredStrategy; "
                "use --jit_compile (forward and backward compiled per replica)")
        self._accum = step.config.train.accum_steps
        self._replica = tf.function(step.replica_step, autograph=False, jit_compile=True)

        @tf.function(autograph=False)  # no reduce_retracing: one trace per concrete shape
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
