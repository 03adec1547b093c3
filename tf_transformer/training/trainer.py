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
from tf_transformer.training import compiled_step, distribution, keras_optimizers, losses
from tf_transformer.training.divergence import DivergenceWatch
from tf_transformer.training.evaluators import Evaluations, Evaluator
from tf_transformer.training.input_state import InputCheckpoint
from tf_transformer.training.policies import Budget, Every, SignalWatch
from tf_transformer.training.reporting import ProgressReporter, default_peak_tflops
from tf_transformer.training.schedule import make_optimizer
from tf_transformer.training.seeds import ReplicaSeeds
from tf_transformer.training.selection import ModelSelection

# Flags each worker raises and the step all-reduces (summed: > 0 means some worker).
SIGNAL, BUDGET, CHECKPOINT_TIME = range(3)


class NonFiniteLossError(RuntimeError):
    """Training produced a NaN or Inf loss; the last good checkpoint is kept."""


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
                 optimizer_fn: Callable[[], keras.optimizers.Optimizer] | None = None):
        """`optimizer_fn`, called in the strategy's scope, makes the optimizer: a
        keras_optimizers.pre_reduced one, since the step all-reduces the gradients
        itself. Default: the paper's Adam on its schedule (schedule.make_optimizer)."""
        self.config = config
        self.model_dir = model_dir
        self.strategy = strategy
        self.chief = distribution.is_chief(strategy)
        self.local_replicas = distribution.local_replicas(strategy)
        self.num_workers = strategy.num_replicas_in_sync // self.local_replicas
        resolver = getattr(strategy, "cluster_resolver", None)
        self.worker_index = (resolver.task_id or 0) if self.num_workers > 1 else 0
        self.peak_tflops = peak_tflops or default_peak_tflops()
        train = config.train
        if train.dtype == "auto":
            raise ValueError("resolve --dtype=auto first (training/precision.py)")
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
        # Built once: a new tf.function per trace would compile the XLA cluster again.
        # (compile_step compiles _replica_step whole, the plain _grads inside it.)
        self._grads_fn = (tf.function(self._grads, jit_compile=True)
                          if train.jit_compile and not train.compile_step else self._grads)
        self._step_fn = None

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

    def save(self) -> str:
        path = self.manager.save(checkpoint_number=self.step)
        if self.inputs.manager is not None:
            self.inputs.save(self.step)
        if not self.chief:
            shutil.rmtree(self._checkpoint_dir(), ignore_errors=True)
        logging.info("saved checkpoint %s", path)
        return path

    # -- the step ------------------------------------------------------------
    def _grads(self, batch, seed_key=None):
        """Sums (not means) over one micro-batch: gradients, loss, tokens.

        `seed_key` (int64 scalar) picks the dropout masks (seeds.py)."""
        with tf.GradientTape() as tape:
            inputs = {k: v for k, v in batch.items() if k != "target_out"}  # packed: + ids
            if seed_key is None:
                states = self.model.states(inputs, training=True)
            else:
                with self.seeds.scope(seed_key):
                    states = self.model.states(inputs, training=True)
            labels = batch["target_out"]
            if not (self.config.train.jit_compile or self.config.train.compile_step):
                # The output layer and softmax only where there is a target token:
                # padding would cost a [d_model, vocab] product per position.
                # (XLA needs static shapes and keeps every position.)
                positions = tf.where(tf.not_equal(labels, PAD_ID))
                states, labels = tf.gather_nd(states, positions), tf.gather_nd(labels, positions)
            token_loss, weights = losses.smoothed_cross_entropy(
                self.model.logits(states), labels, self.config.train.label_smoothing)
            loss_sum = tf.reduce_sum(token_loss)
            scaled = (self.optimizer.scale_loss(loss_sum)
                      if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer) else loss_sum)
        grads = tape.gradient(scaled, self.model.trainable_variables)
        grads = [tf.convert_to_tensor(g) for g in grads]
        source_tokens = tf.reduce_sum(tf.cast(batch["source"] != PAD_ID, tf.float32))
        return grads, loss_sum, tf.reduce_sum(weights), source_tokens

    def _seed_key(self, micro: int) -> tf.Tensor:
        """(step * accum + micro) * replicas + global replica id: one dropout stream each."""
        context = tf.distribute.get_replica_context()
        replica = tf.cast(context.replica_id_in_sync_group, tf.int64)
        step = tf.cast(self.optimizer.iterations, tf.int64)
        return ((step * self.config.train.accum_steps + micro)
                * self.strategy.num_replicas_in_sync + replica)

    def _replica_step(self, batches, flags):
        flags = tf.identity(flags)  # on this replica's device, like the other sums
        grads, loss_sum, tokens, source_tokens, step_flops = None, 0.0, 0.0, 0.0, 0.0
        for micro, batch in enumerate(batches):
            more, l, t, s = self._grads_fn(batch, self._seed_key(micro))
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

    def step_fn(self) -> Callable:
        """tf.function(iterator, flags=None) -> dict of float32 scalars, one optimizer step.

        `iterator`: a plain iterator of per-replica batches (this worker's; the
        trainer's own, checkpointable) or a distributed one. `flags` [3] float32:
        this worker's SIGNAL, BUDGET, CHECKPOINT_TIME; returned summed over replicas.
        """
        if self._step_fn is None and self.config.train.compile_step:
            self._step_fn = compiled_step.CompiledStep(self)
        if self._step_fn is None:
            accum, local = self.config.train.accum_steps, self.local_replicas

            # reduce_retracing: one graph for every bucket shape (XLA, when on,
            # still compiles each concrete shape once).
            @tf.function(reduce_retracing=True)
            def step(iterator, flags=None):
                if flags is None:
                    flags = tf.zeros([3])
                if isinstance(iterator, tf.distribute.DistributedIterator):
                    batches = tuple(next(iterator) for _ in range(accum))
                else:  # element i * local + r is replica r's micro-batch i
                    elements = [next(iterator) for _ in range(accum * local)]
                    batches = self.strategy.experimental_distribute_values_from_function(
                        lambda ctx: tuple(elements[i * local + ctx.replica_id_in_sync_group % local]
                                          for i in range(accum)))
                out = self.strategy.run(self._replica_step, args=(batches, flags))
                # Values are all-reduced, hence equal on every replica.
                return {k: self.strategy.experimental_local_results(v)[0] for k, v in out.items()}

            self._step_fn = step
        return self._step_fn

    def learning_rate(self) -> float:
        lr = self.optimizer.learning_rate
        return float(lr.numpy() if hasattr(lr, "numpy") else lr)

    def _iterator(self, dataset_fn, start_step: int):
        """This worker's input iterator, at the saved position when there is one.

        dataset_fn(start_step)(input_context): start_step is 0 when the saved
        position is restored, else the steps the pipeline should account for."""
        saved = start_step > 0 and self.inputs.has(start_step)
        context = tf.distribute.InputContext(self.num_workers, self.worker_index,
                                             self.strategy.num_replicas_in_sync)
        iterator = iter(dataset_fn(0 if saved else start_step)(context))
        self.inputs.attach(iterator)
        if saved:
            self.inputs.restore(start_step)
        elif start_step:
            logging.warning("no saved input position for step %d: the input restarts", start_step)
        return iterator

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
        iterator = self._iterator(dataset_fn, start_step)
        step_fn = self.step_fn()
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
        loss, stopped_by, path = math.nan, "max_steps", None
        try:
            with SignalWatch() as signals:
                while self.step < max_steps:
                    flags = np.zeros([3], np.float32)
                    flags[[SIGNAL, BUDGET, CHECKPOINT_TIME]] = [
                        signals.received is not None,
                        budget.spent() or evaluations.stop_requested, checkpoints.time_due()]
                    before = self.step
                    out = {k: v.numpy() for k, v in step_fn(iterator, tf.constant(flags)).items()}
                    step, loss = self.step, float(out["loss"])
                    if not math.isfinite(loss):
                        raise NonFiniteLossError(
                            f"loss is {loss} at step {step}; stopping without saving, the last "
                            f"good checkpoint is {tf.train.latest_checkpoint(self.model_dir)}")
                    skipped = step == before
                    if skipped:
                        logging.warning("step %d skipped: gradients overflowed at loss scale %g",
                                        step + 1, self.loss_scale)
                    reporter.record(step, {k: float(v) for k, v in out.items() if k != "flags"},
                                    skipped, self.learning_rate(), self.loss_scale,
                                    force=step == max_steps and not skipped)
                    agreed = out["flags"] > 0
                    saved = False
                    if agreed[CHECKPOINT_TIME] or (not skipped and (
                            checkpoints.step_due(step) or evaluations.wants_checkpoint(step))):
                        path, saved = self.save(), True
                        checkpoints.reset()
                    if saved or not skipped:
                        evaluations.after_step(step, path if saved else None)
                    if agreed[SIGNAL] or agreed[BUDGET]:
                        stopped_by = ("signal" if agreed[SIGNAL] else
                                      "early_stop" if evaluations.stop_requested else "max_minutes")
                        break
            if path is None or not path.endswith(f"-{self.step}"):
                path = self.save()
            evaluations.run(self.step, path)
        finally:
            writer.flush()
        return TrainResult(self.step, loss, stopped_by, path, reporter.tokens_per_sec,
                           reporter.skipped_steps)
