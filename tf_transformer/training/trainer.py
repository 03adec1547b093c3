"""The training loop of section 5, for one device, mirrored GPUs or many workers.

One optimizer step = `accum_steps` batches on every replica. The loss is the
sum of label-smoothed token losses divided by the number of non-pad target
tokens across all replicas and micro-batches, so a step is the same whatever
the replica count (tests/training/test_trainer.py checks 1 vs 2 replicas and
accumulation against a batch twice as large).

Distributed contract: every decision that changes what the next collective
is (stop for the time budget or a signal, checkpoint now) travels as a flag
inside the step's own all-reduce, so all workers act on the same step; the
step count (max_steps, checkpoint_steps) is the same everywhere by itself.

The host runs ahead of the devices: host_loop.py queues `steps_per_call` steps
per call and reads the device only at sync steps; the next step's batches are
copied to the devices while a step computes (input_state.Staged).
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import shutil
from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from tf_transformer.config import PAD_ID, Config
from tf_transformer.model import build_model, flops
from tf_transformer.training import compiled_step, distribution, host_loop, keras_optimizers, losses
from tf_transformer.training.divergence import DivergenceWatch
from tf_transformer.training.evaluators import Evaluations, Evaluator
from tf_transformer.training.input_state import InputCheckpoint, Staged
from tf_transformer.training.policies import Budget, Every, SignalWatch, next_sync_step
from tf_transformer.training.reporting import ProgressReporter, default_peak_tflops
from tf_transformer.training.schedule import make_optimizer
from tf_transformer.training.seeds import ReplicaSeeds
from tf_transformer.training.selection import ModelSelection

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


@dataclasses.dataclass
class TrainResult:
    step: int
    loss: float
    stopped_by: str  # "max_steps", "max_minutes", "signal" or "early_stop"
    checkpoint: str | None
    tokens_per_sec: float
    skipped_steps: int = 0


class Trainer:
    """Owns the model, optimizer, checkpoints and the distributed step function."""

    def __init__(self, config: Config, model_dir: str, strategy: tf.distribute.Strategy,
                 keep_checkpoints: int | None = None, peak_tflops: float | None = None,
                 optimizer_fn: Callable[[], keras.optimizers.Optimizer] | None = None,
                 step_policy: StepPolicy | None = None):
        """`optimizer_fn`, called in the strategy's scope, makes the optimizer: a
        keras_optimizers.pre_reduced one, since the step all-reduces the gradients
        itself. Default: the paper's Adam on its schedule (schedule.make_optimizer).
        `step_policy` defaults to the one for the strategy's devices."""
        self.config = config
        self.model_dir = model_dir
        self.strategy = strategy
        self.chief = distribution.is_chief(strategy)
        self.devices = distribution.local_devices(strategy)
        self.local_replicas = len(self.devices)
        self.num_workers = strategy.num_replicas_in_sync // self.local_replicas
        resolver = getattr(strategy, "cluster_resolver", None)
        self.worker_index = (resolver.task_id or 0) if self.num_workers > 1 else 0
        self.peak_tflops = peak_tflops or default_peak_tflops()
        train = config.train
        if train.dtype == "auto":
            raise ValueError("resolve --dtype=auto first (training/precision.py)")
        compiled = train.jit_compile or train.compile_step
        self.step_policy = step_policy or step_policy_for(
            distribution.device_type(self.devices), compiled)
        dtype = None if train.dtype == "float32" else train.dtype
        # The same initial weights and dropout seeds for the same seed. Keras draws
        # its default seeds from Python's `random`; tf.random.set_seed is avoided on
        # purpose: it clears TensorFlow's kernel cache, which destroys live
        # SentencePiece resources (tensorflow-text) created before this point.
        random.seed(train.seed)
        np.random.seed(train.seed)
        with strategy.scope():
            self.model = build_model(config.model, dtype=dtype)
            optimizer = (optimizer_fn() if optimizer_fn is not None else
                         make_optimizer(train, config.model.d_model, pre_reduced=True))
            if not keras_optimizers.is_pre_reduced(optimizer):
                raise TypeError(f"{type(optimizer).__name__} would all-reduce the gradients "
                                "again: make it with keras_optimizers.pre_reduced")
            if train.dtype == "mixed_float16":
                optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
            self.optimizer = optimizer
            self.optimizer.build(self.model.trainable_variables)
        self.seeds = ReplicaSeeds(self.model)
        keep = keep_checkpoints or train.keep_checkpoints
        self.checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer)
        self.manager = tf.train.CheckpointManager(self.checkpoint, self._checkpoint_dir(),
                                                  max_to_keep=keep)
        self.inputs = InputCheckpoint(model_dir, self.worker_index, keep)
        self.staging = Staged(self.devices, train.accum_steps)
        # The agreed flags of the step that ended a call; while any is set, calls do
        # nothing until the host has acted on them (a plain variable of this worker).
        self.pending = tf.Variable(tf.zeros([3]), trainable=False)
        # Built once: a new tf.function per trace would compile the XLA cluster again.
        # (compile_step compiles _replica_step whole; jit_compile each micro-batch's
        # forward and backward, one trace for every replica.)
        self.replica_grads = (compiled_step.ReplicaGrads(self)
                              if train.jit_compile and not train.compile_step else None)
        self._step_fn = None
        self._loop_fn = None

    # -- checkpoints ---------------------------------------------------------
    def _checkpoint_dir(self) -> str:
        """Non-chief workers take part in every save but write to a scratch dir."""
        if self.chief:
            return self.model_dir
        return os.path.join(self.model_dir, f".worker_{self.worker_index}_scratch")

    @property
    def step(self) -> int:
        return int(self.optimizer.iterations.numpy())

    @property
    def loss_scale(self) -> float | None:
        if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
            return float(self.optimizer.dynamic_scale.numpy())
        return None

    def restore(self) -> int:
        """Restores the latest checkpoint of model_dir, if any; returns the step."""
        path = tf.train.latest_checkpoint(self.model_dir)
        if path:
            self.checkpoint.restore(path).assert_existing_objects_matched()
            logging.info("restored %s at step %d", path, self.step)
        return self.step

    def save(self, step: int | None = None, staged=None) -> str:
        """Checkpoints the model and optimizer, and the input position with `staged`
        (the next step's batches already taken from the iterator, or None)."""
        step = self.step if step is None else step
        path = self.manager.save(checkpoint_number=step)
        if self.inputs.manager is not None:
            self.inputs.save(step, None if staged is None else self.staging.serialize(staged))
        if not self.chief:
            shutil.rmtree(self._checkpoint_dir(), ignore_errors=True)
        logging.info("saved checkpoint %s", path)
        return path

    # -- the step ------------------------------------------------------------
    def _loss_sums(self, batch, seed_key=None):
        """(sum of token losses, non-pad target tokens) of one micro-batch, float32.

        `seed_key` (int64 scalar) picks the dropout masks (seeds.py)."""
        inputs = {k: v for k, v in batch.items() if k != "target_out"}  # packed: + ids
        if seed_key is None:
            states = self.model.states(inputs, training=True)
        else:
            with self.seeds.scope(seed_key):
                states = self.model.states(inputs, training=True)
        labels = batch["target_out"]
        if self.step_policy.gather_targets:
            # The output layer and softmax only where there is a target token:
            # padding would cost a [d_model, vocab] product per position.
            positions = tf.where(tf.not_equal(labels, PAD_ID))
            states, labels = tf.gather_nd(states, positions), tf.gather_nd(labels, positions)
            # Pad rows (label PAD, weight 0) to a multiple of GATHERED_ROWS_MULTIPLE:
            # the compiled loss sees a few shapes, not one per token count.
            pad = -tf.shape(labels)[0] % GATHERED_ROWS_MULTIPLE
            states = tf.pad(states, [[0, pad], [0, 0]])
            labels = tf.pad(labels, [[0, pad]], constant_values=PAD_ID)
        token_loss, weights = losses.compiled_smoothed_cross_entropy(
            self.model.logits(states), labels, self.config.train.label_smoothing)
        return tf.reduce_sum(token_loss), tf.reduce_sum(weights)

    def _loss_scale_factor(self):
        if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
            return tf.cast(self.optimizer.dynamic_scale, tf.float32)
        return tf.constant(1.0)

    def _grads(self, batch, seed_key=None):
        """Sums (not means) over one micro-batch: gradients, loss, tokens.

        `seed_key` (int64 scalar) picks the dropout masks (seeds.py)."""
        with tf.GradientTape() as tape:
            loss_sum, tokens = self._loss_sums(batch, seed_key)
            scaled = loss_sum * self._loss_scale_factor()
        grads = tape.gradient(scaled, self.model.trainable_variables)
        grads = [tf.convert_to_tensor(g) for g in grads]
        return grads, loss_sum, tokens, source_token_count(batch)

    def _seed_key(self, micro: int) -> tf.Tensor:
        """(step * accum + micro) * replicas + global replica id: one dropout stream each."""
        context = tf.distribute.get_replica_context()
        replica = tf.cast(context.replica_id_in_sync_group, tf.int64)
        step = tf.cast(self.optimizer.iterations, tf.int64)
        return ((step * self.config.train.accum_steps + micro)
                * self.strategy.num_replicas_in_sync + replica)

    def _replica_step(self, batches, flags):
        flags = tf.identity(flags)  # on this replica's device, like the other sums
        grads_fn = self.replica_grads or self._grads
        grads, loss_sum, tokens, source_tokens, step_flops = None, 0.0, 0.0, 0.0, 0.0
        for micro, batch in enumerate(batches):
            more, l, t, s = grads_fn(batch, self._seed_key(micro))
            grads = more if grads is None else [a + b for a, b in zip(grads, more)]
            loss_sum, tokens, source_tokens = loss_sum + l, tokens + t, source_tokens + s
            shape = tf.cast(tf.shape(batch["source"]), tf.float32)
            step_flops += flops.train_step_flops(self.config.model, shape[0], shape[1],
                                                 tf.cast(tf.shape(batch["target_in"])[1], tf.float32))
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

    def _distribute(self, staged):
        """Per-replica values of staged batches (already on each replica's device)."""
        local = self.local_replicas
        return self.strategy.experimental_distribute_values_from_function(
            lambda ctx: staged[ctx.replica_id_in_sync_group % local])

    def _run_step(self, staged, flags) -> dict:
        out = self.strategy.run(self._replica_step, args=(self._distribute(staged), flags))
        # Values are all-reduced, hence equal on every replica.
        return {k: self.strategy.experimental_local_results(v)[0] for k, v in out.items()}

    def step_fn(self) -> Callable:
        """tf.function(iterator, flags=None) -> dict of float32 scalars, one optimizer step.

        `iterator`: this worker's iterator of per-replica batches (element i * local
        + r is replica r's micro-batch i). `flags` [3] float32: this worker's SIGNAL,
        BUDGET, CHECKPOINT_TIME; returned summed over replicas. (The loop of `train`
        runs `loop_fn` instead; both run `_replica_step`.)
        """
        if self._step_fn is None and self.config.train.compile_step:
            self._step_fn = compiled_step.CompiledStep(self)
        if self._step_fn is None:
            # reduce_retracing: one graph for every bucket shape.
            @tf.function(autograph=False, reduce_retracing=True)
            def traced(iterator, flags):
                return self._run_step(self.staging.fetch(iterator), flags)

            def step(iterator, flags=None):
                self._prepare(iterator.element_spec)
                return traced(iterator, tf.zeros([3]) if flags is None else flags)

            self._step_fn = step
        return self._step_fn

    def _prepare(self, element_spec) -> None:
        """Traces what the step calls as a concrete function (eagerly, once)."""
        if self.replica_grads is not None:
            self.replica_grads.prepare(element_spec)

    def loop_fn(self) -> Callable:
        """The loop's call (host_loop.make_loop), built once."""
        if self._loop_fn is None:
            self._loop_fn = host_loop.make_loop(self)
        return self._loop_fn

    def learning_rate(self) -> float:
        lr = self.optimizer.learning_rate
        return float(lr.numpy() if hasattr(lr, "numpy") else lr)

    def _iterator(self, dataset_fn, start_step: int):
        """This worker's input iterator, at the saved position when there is one, and
        the staged batches saved with it (serialized; None if there are none).

        dataset_fn(start_step)(input_context): start_step is 0 when the saved
        position is restored, else the steps the pipeline should account for."""
        saved = start_step > 0 and self.inputs.has(start_step)
        context = tf.distribute.InputContext(self.num_workers, self.worker_index,
                                             self.strategy.num_replicas_in_sync)
        iterator = iter(dataset_fn(0 if saved else start_step)(context))
        self.inputs.attach(iterator)
        staged = None
        if saved:
            serialized = self.inputs.restore(start_step)
            if serialized.shape[0]:
                staged = self.staging.deserialize(serialized, iterator.element_spec)
        elif start_step:
            logging.warning("no saved input position for step %d: the input restarts", start_step)
        return iterator, staged

    # -- the loop --------------------------------------------------------------
    def train(self, dataset_fn, max_steps: int, max_minutes: float | None = None,
              evaluate_fn: Evaluator | None = None,
              eval_every: int = 0, log_fn: Callable[[str], None] = logging.info,
              unigram_loss: float | None = None) -> TrainResult:
        """Trains until `max_steps` (global), `max_minutes`, SIGTERM/SIGINT or early stop.

        Checkpoints (weights, optimizer, input position) every
        `checkpoint_minutes` and/or `checkpoint_steps`, at a signal and at the end.
        The budget and signals stop the loop after the step that carried them.
        With `evaluate_fn`, model_dir/best/ keeps the `keep_best` best checkpoints
        and `early_stop` evaluations without improvement stop the run (selection.py);
        with `unigram_loss`, a loss flat at that level is reported (divergence.py).
        """
        train = self.config.train
        start_step = self.restore()
        writer = (tf.summary.create_file_writer(os.path.join(self.model_dir, "train"))
                  if self.chief else tf.summary.create_noop_writer())
        iterator, staged = self._iterator(dataset_fn, start_step)
        watch = (DivergenceWatch(unigram_loss, train.divergence_steps, train.warmup_steps)
                 if unigram_loss and train.divergence_steps else None)
        reporter = ProgressReporter(writer, log_fn, train.log_every,
                                    self.strategy.num_replicas_in_sync, self.peak_tflops,
                                    divergence=watch)
        selection = ModelSelection(self.model_dir, train.keep_best, train.early_stop,
                                   self.chief, start_step, log_fn)
        evaluations = Evaluations(evaluate_fn, eval_every, self.model, writer, log_fn, selection)
        checkpoints, budget = Every(train.checkpoint_minutes, train.checkpoint_steps), \
            Budget(max_minutes)
        calls = host_loop.Calls(self, iterator, staged)
        # mixed_float16 may skip a step without advancing the count, and compile_step
        # takes its batches in Python: both read the device after every call.
        every_call = train.compile_step or self.loss_scale is not None
        sync_every = (train.log_every, train.checkpoint_steps, eval_every)
        step, loss, stopped_by, path = start_step, math.nan, "max_steps", None
        try:
            with SignalWatch() as signals:
                while step < max_steps:
                    flags = np.zeros([3], np.float32)
                    flags[[SIGNAL, BUDGET, CHECKPOINT_TIME]] = [
                        signals.received is not None,
                        budget.spent() or evaluations.stop_requested, checkpoints.time_due()]
                    end = next_sync_step(step, max_steps, sync_every)
                    n = min(train.steps_per_call, end - step)
                    calls.run(flags, n, more=step + n < max_steps)
                    step += n  # as far as the host knows: a set flag stops the device early
                    if not (every_call or step == end):
                        continue
                    rows, before = calls.read(), step - n if every_call else None
                    step, loss, skipped, agreed = host_loop.account(
                        rows, reporter, max_steps, before, self.learning_rate,
                        lambda: self.loss_scale, self.model_dir)
                    saved = False
                    if agreed[CHECKPOINT_TIME] or (not skipped and (
                            checkpoints.step_due(step) or evaluations.wants_checkpoint(step))):
                        path, saved = self.save(step, calls.staged_for_save()), True
                        checkpoints.reset()
                    if saved or not skipped:
                        evaluations.after_step(step, path if saved else None)
                    if agreed[SIGNAL] or agreed[BUDGET]:
                        stopped_by = ("signal" if agreed[SIGNAL] else
                                      "early_stop" if evaluations.stop_requested else "max_minutes")
                        break
                    if agreed.any():
                        self.pending.assign(tf.zeros([3]))
            if path is None or not path.endswith(f"-{step}"):
                path = self.save(step, calls.staged_for_save())
            evaluations.run(step, path)
        finally:
            writer.flush()
        return TrainResult(step, loss, stopped_by, path, reporter.tokens_per_sec,
                           reporter.skipped_steps)


def source_token_count(batch) -> tf.Tensor:
    """Non-pad source tokens of a batch, float32."""
    return tf.reduce_sum(tf.cast(batch["source"] != PAD_ID, tf.float32))
