"""One optimizer step of section 5: loss sums, gradients, dropout keys, the replica step and
its distributed run, as an object the trainer, the compiled step and the host loop receive.

One optimizer step = `accum_steps` batches on every replica. The loss is the
sum of label-smoothed token losses divided by the number of non-pad target
tokens across all replicas and micro-batches, so a step is the same whatever
the replica count (tests/training/test_trainer.py checks 1 vs 2 replicas and
accumulation against a batch twice as large).

Dropout masks are passed, not found: each micro-batch's forward pass gets the key
(step * accum_steps + micro-batch) * replicas + global replica id
(`dropout_key`), which the model hands to every Dropout (model/layers/dropout.py).
The masks are then a function of (seed, layer, step, micro-batch, replica):
distinct across replicas and workers, and restored by restoring the step, so no
random state is checkpointed.

R-Drop (TrainConfig.rdrop_alpha > 0, `rdrop_sums`): each micro-batch goes through the
model twice in one pass over its rows doubled, and the gradient is that of the two
cross-entropies plus the symmetric KL of the two outputs; the reported loss stays
the cross-entropy (the mean of the two passes), divided by the same token count.
"""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

from tf_transformer.config import PAD_ID, Config
from tf_transformer.model import flops
from tf_transformer.training import compiled_step, losses
from tf_transformer.training.input_state import Staged

# Flags each worker raises and the step all-reduces (summed: > 0 means some worker).
SIGNAL, BUDGET, CHECKPOINT_TIME = range(3)
# Gathered target rows are padded to a multiple of this (~3% more output-layer rows at
# the small preset's 4,000 tokens): one compilation of the loss per multiple.
GATHERED_ROWS_MULTIPLE = 128


@dataclasses.dataclass(frozen=True)
class StepPolicy:
    """The step's device-dependent choice, decided in one place (`step_policy_for`).

    gather_targets: the output layer and softmax only on non-pad target positions
      (tf.where + gather_nd): fewer products, but a shape that depends on the data,
      which makes a GPU wait mid-step for the count and keeps XLA from compiling
      the step. Otherwise every position, pads weighted 0: equal loss and gradients.
    """

    gather_targets: bool


def step_policy_for(device_type: str, compiled: bool) -> StepPolicy:
    """The gather only on CPU without XLA, where it was measured (BUILD.md)."""
    return StepPolicy(gather_targets=device_type == "CPU" and not compiled)


class TrainStep:
    """The step's computation over a model and its (pre-reduced) optimizer.

    `staging` moves each step's batches to the replicas' devices (input_state.Staged);
    with --jit_compile (and not --compile_step) each micro-batch's forward and backward
    run as one XLA function, `replica_grads` (compiled_step.ReplicaGrads).
    """

    def __init__(self, model: keras.Model, optimizer: keras.optimizers.Optimizer,
                 config: Config, strategy: tf.distribute.Strategy, policy: StepPolicy,
                 staging: Staged):
        self.model, self.optimizer, self.config = model, optimizer, config
        self.strategy, self.policy, self.staging = strategy, policy, staging
        train = config.train
        # Built once: a new tf.function per trace would compile the XLA cluster again.
        self.replica_grads = (compiled_step.ReplicaGrads(self)
                              if train.jit_compile and not train.compile_step else None)

    def loss_sums(self, batch: dict, dropout_key: tf.Tensor | None = None):
        """(sum of token losses, non-pad target tokens) of one micro-batch, float32.

        batch: source [b, S], target_in and target_out [b, T] int32 (packed rows: + ids).
        `dropout_key` (int64 scalar) picks the dropout masks; None: Keras's own draws."""
        inputs = {k: v for k, v in batch.items() if k != "target_out"}
        states = self.model.states(inputs, training=True, dropout_key=dropout_key)
        labels = batch["target_out"]
        if self.policy.gather_targets:
            states, labels = gather_target_rows(states, labels)
        token_loss, weights = losses.compiled_smoothed_cross_entropy(
            self.model.logits(states), labels, self.config.train.label_smoothing)
        return tf.reduce_sum(token_loss), tf.reduce_sum(weights)

    def objective_sums(self, batch: dict, dropout_key: tf.Tensor | None = None):
        """(objective sum, loss sum, non-pad target tokens) of one micro-batch, float32:
        the gradient is the objective's, the reported loss the cross-entropy's.

        rdrop_alpha 0: `loss_sums`, the objective its loss (the same graph as without
        R-Drop). Otherwise `rdrop_sums`."""
        if self.config.train.rdrop_alpha > 0:
            return self.rdrop_sums(batch, dropout_key)
        loss_sum, tokens = self.loss_sums(batch, dropout_key)
        return loss_sum, loss_sum, tokens

    def rdrop_sums(self, batch: dict, dropout_key: tf.Tensor | None = None):
        """R-Drop (Liang et al. 2021): (objective sum, loss sum, tokens) of two passes.

        One forward pass over the rows doubled ([2b, ...]: the batch, then itself) with
        the micro-batch's one key: a Dropout draws its mask over the whole [2b, ...]
        shape from that key, so the halves take disjoint counters of its stream and get
        independent masks, and no other key is spent (the key space stays (step,
        micro-batch, replica): resume stays exact). On the gathered path both halves
        keep the same non-pad rows in the same order, so the divergence compares a
        position with itself.

        Per non-pad token, with CE_i the smoothed cross-entropy of pass i and
        D = KL(P1||P2) + KL(P2||P1):
            objective = (CE_1 + CE_2) / 2 + alpha / 4 * D,
        half the paper's per-token loss CE_1 + CE_2 + alpha / 2 * D (fairseq's
        `label_smoothed_cross_entropy_with_rdrop`, which divides by one pass's tokens):
        alpha means what it means there, the step divides by the global count of
        one pass's non-pad target tokens as without R-Drop, and the reported loss,
        (CE_1 + CE_2) / 2, stays comparable across settings. Adam is invariant to
        the factor 1/2 (up to its epsilon). Without dropout both passes are equal, D
        is 0 and the step is the one-pass step (to float rounding).
        """
        train = self.config.train
        inputs = {k: tf.concat([v, v], 0) for k, v in batch.items() if k != "target_out"}
        states = self.model.states(inputs, training=True, dropout_key=dropout_key)
        first, second = tf.split(states, 2)
        labels = batch["target_out"]
        if self.policy.gather_targets:
            first, gathered = gather_target_rows(first, labels)
            second, _ = gather_target_rows(second, labels)
            labels = gathered
        logits = self.model.logits(tf.concat([first, second], 0))
        token_loss, weights = losses.compiled_smoothed_cross_entropy(
            logits, tf.concat([labels, labels], 0), train.label_smoothing)
        divergence, _ = losses.compiled_symmetric_kl(*tf.split(logits, 2), labels)
        loss_sum = tf.reduce_sum(token_loss) / 2.0
        objective = loss_sum + (train.rdrop_alpha / 4.0) * tf.reduce_sum(divergence)
        return objective, loss_sum, tf.reduce_sum(weights) / 2.0

    def loss_scale_factor(self) -> tf.Tensor:
        """The mixed_float16 loss scale (float32 scalar), else 1."""
        if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
            return tf.cast(self.optimizer.dynamic_scale, tf.float32)
        return tf.constant(1.0)

    def grads(self, batch: dict, dropout_key: tf.Tensor | None = None):
        """Sums (not means) over one micro-batch: (gradients of the objective, loss, tokens,
        source tokens); see `objective_sums`."""
        with tf.GradientTape() as tape:
            objective, loss_sum, tokens = self.objective_sums(batch, dropout_key)
            scaled = objective * self.loss_scale_factor()
        grads = tape.gradient(scaled, self.model.trainable_variables)
        grads = [tf.convert_to_tensor(g) for g in grads]
        return grads, loss_sum, tokens, source_token_count(batch)

    def dropout_key(self, micro: int) -> tf.Tensor:
        """(step * accum + micro) * replicas + global replica id: one dropout stream each.

        int64 scalar, in replica context."""
        context = tf.distribute.get_replica_context()
        replica = tf.cast(context.replica_id_in_sync_group, tf.int64)
        step = tf.cast(self.optimizer.iterations, tf.int64)
        return ((step * self.config.train.accum_steps + micro)
                * self.strategy.num_replicas_in_sync + replica)

    def replica_step(self, batches, flags) -> dict:
        """One replica's part of a step, in replica context: its `accum_steps` batches'
        gradients, all-reduced with the loss, token and FLOP sums and the `flags` [3]
        (SIGNAL, BUDGET, CHECKPOINT_TIME), then the update. -> dict of float32 scalars."""
        flags = tf.identity(flags)  # on this replica's device, like the other sums
        grads_fn = self.replica_grads or self.grads
        grads, loss_sum, tokens, source_tokens, step_flops = None, 0.0, 0.0, 0.0, 0.0
        for micro, batch in enumerate(batches):
            more, l, t, s = grads_fn(batch, self.dropout_key(micro))
            grads = more if grads is None else [a + b for a, b in zip(grads, more)]
            loss_sum, tokens, source_tokens = loss_sum + l, tokens + t, source_tokens + s
            shape = tf.cast(tf.shape(batch["source"]), tf.float32)
            if self.config.train.rdrop_alpha > 0:
                shape = shape * tf.constant([2.0, 1.0])  # R-Drop's pass over doubled rows
            target_length = tf.cast(tf.shape(batch["target_in"])[1], tf.float32)
            step_flops += flops.train_step_flops(self.config.model, shape[0], shape[1],
                                                 target_length)
        context = tf.distribute.get_replica_context()
        loss_sum, tokens, source_tokens, step_flops, flags = context.all_reduce(
            tf.distribute.ReduceOp.SUM, [loss_sum, tokens, source_tokens, step_flops, flags])
        grads = context.all_reduce(tf.distribute.ReduceOp.SUM, grads)
        denominator = tf.maximum(tokens, 1.0)
        grads = [g / tf.cast(denominator, g.dtype) for g in grads]
        grad_norm = tf.linalg.global_norm(grads)
        if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
            grad_norm = grad_norm / tf.cast(self.optimizer.dynamic_scale, grad_norm.dtype)
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
        return {"loss": loss_sum / denominator, "target_tokens": tokens,
                "source_tokens": source_tokens, "grad_norm": grad_norm, "flops": step_flops,
                "flags": flags}

    def distribute(self, staged):
        """Per-replica values of staged batches (already on each replica's device)."""
        local = len(self.staging.devices)
        return self.strategy.experimental_distribute_values_from_function(
            lambda ctx: staged[ctx.replica_id_in_sync_group % local])

    def run(self, staged, flags) -> dict:
        """The replica step on every replica: staged batches (Staged.fetch), flags [3]
        float32 -> dict of float32 scalars, all-reduced, hence equal on every replica."""
        out = self.strategy.run(self.replica_step, args=(self.distribute(staged), flags))
        return {k: self.strategy.experimental_local_results(v)[0] for k, v in out.items()}

    def prepare(self, element_spec) -> None:
        """Traces what the step calls as a concrete function (eagerly, once)."""
        if self.replica_grads is not None:
            self.replica_grads.prepare(element_spec)

    def step_fn(self):
        """tf.function(iterator, flags=None) -> dict of float32 scalars, one optimizer step.

        `iterator`: this worker's iterator of per-replica batches (element i * local
        + r is replica r's micro-batch i). `flags` [3] float32: this worker's SIGNAL,
        BUDGET, CHECKPOINT_TIME; returned summed over replicas. Build it once: each
        call builds a new function. (--compile_step: compiled_step.CompiledStep.)
        """
        if self.config.train.compile_step:
            return compiled_step.CompiledStep(self)

        # reduce_retracing: one graph for every bucket shape.
        @tf.function(autograph=False, reduce_retracing=True)
        def traced(iterator, flags):
            return self.run(self.staging.fetch(iterator), flags)

        def step(iterator, flags=None):
            self.prepare(iterator.element_spec)
            return traced(iterator, tf.zeros([3]) if flags is None else flags)

        return step


def gather_target_rows(states, labels):
    """The output layer and softmax only where there is a target token: padding would
    cost a [d_model, vocab] product per position. states [b, T, d_model], labels [b, T]
    -> ([n, d_model], [n]) in row-major order, n the non-pad count padded (label PAD,
    weight 0) to a multiple of GATHERED_ROWS_MULTIPLE: the compiled loss sees a few
    shapes, not one per token count."""
    positions = tf.where(tf.not_equal(labels, PAD_ID))
    states, labels = tf.gather_nd(states, positions), tf.gather_nd(labels, positions)
    pad = -tf.shape(labels)[0] % GATHERED_ROWS_MULTIPLE
    states = tf.pad(states, [[0, pad], [0, 0]])
    return states, tf.pad(labels, [[0, pad]], constant_values=PAD_ID)


def source_token_count(batch) -> tf.Tensor:
    """Non-pad source tokens of a batch, float32."""
    return tf.reduce_sum(tf.cast(batch["source"] != PAD_ID, tf.float32))
