"""The training loop of section 5, for one device, mirrored GPUs or many workers.

The step itself (loss, gradients, dropout keys, the all-reduce and the update) is
step.py's `TrainStep`; this module owns the model, the optimizer and the
checkpoints, and runs the loop: a plain loop over the sync points of host_loop.py.

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
import random
import shutil
from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from tf_transformer.config import Config
from tf_transformer.model import build_model
from tf_transformer.model_dir import ModelDir
from tf_transformer.training import distribution, host_loop, keras_optimizers
from tf_transformer.training.divergence import DivergenceWatch
from tf_transformer.training.evaluators import Evaluations, Evaluator
from tf_transformer.training.input_state import InputCheckpoint, Staged
from tf_transformer.training.policies import Budget, Every, SignalWatch
from tf_transformer.training.reporting import ProgressReporter, default_peak_tflops
from tf_transformer.training.schedule import make_optimizer
from tf_transformer.training.selection import ModelSelection
from tf_transformer.training.step import (BUDGET, CHECKPOINT_TIME, SIGNAL, StepPolicy, TrainStep,
                                          step_policy_for)

__all__ = ["StepPolicy", "TrainResult", "Trainer", "step_policy_for"]


@dataclasses.dataclass
class TrainResult:
    step: int
    loss: float
    stopped_by: str  # "max_steps", "max_minutes", "signal" or "early_stop"
    checkpoint: str | None
    tokens_per_sec: float
    skipped_steps: int = 0


class Trainer:
    """Owns the model, optimizer and checkpoints, and runs the step (`train_step`) in a loop."""

    def __init__(self, config: Config, model_dir: ModelDir | str,
                 strategy: tf.distribute.Strategy,
                 keep_checkpoints: int | None = None, peak_tflops: float | None = None,
                 optimizer_fn: Callable[[], keras.optimizers.Optimizer] | None = None,
                 step_policy: StepPolicy | None = None):
        """`optimizer_fn`, called in the strategy's scope, makes the optimizer: a
        keras_optimizers.pre_reduced one, since the step all-reduces the gradients
        itself. Default: the paper's Adam on its schedule (schedule.make_optimizer).
        `step_policy` defaults to the one for the strategy's devices."""
        self.config = config
        self.model_dir = ModelDir.of(model_dir)
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
        # The same initial weights and dropout seeds for the same seed. Keras (and our
        # Dropout) draw default seeds from Python's `random`; tf.random.set_seed is avoided on
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
        self.train_step = TrainStep(self.model, self.optimizer, config, strategy,
                                    self.step_policy, Staged(self.devices, train.accum_steps))
        keep = keep_checkpoints or train.keep_checkpoints
        self.checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer)
        # Non-chief workers take part in every save but write to a scratch dir.
        self.checkpoint_dir = self.model_dir.checkpoint_dir(self.worker_index, self.chief)
        self.manager = tf.train.CheckpointManager(self.checkpoint, self.checkpoint_dir,
                                                  max_to_keep=keep)
        self.inputs = InputCheckpoint(self.model_dir, self.worker_index, keep)
        # The agreed flags of the step that ended a call; while any is set, calls do
        # nothing until the host has acted on them (a plain variable of this worker).
        self.pending = tf.Variable(tf.zeros([3]), trainable=False)
        self._step_fn = None
        self._loop_fn = None

    # -- checkpoints ---------------------------------------------------------
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
        path = self.model_dir.latest_checkpoint()
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
            self.inputs.save(step, None if staged is None
                             else self.train_step.staging.serialize(staged))
        if not self.chief:
            shutil.rmtree(self.checkpoint_dir, ignore_errors=True)
        logging.info("saved checkpoint %s", path)
        return path

    def step_fn(self) -> Callable:
        """The step's `step_fn()` (TrainStep.step_fn), built once: one optimizer step per call."""
        if self._step_fn is None:
            self._step_fn = self.train_step.step_fn()
        return self._step_fn

    def loop_fn(self) -> Callable:
        """The loop's call (host_loop.make_loop), built once."""
        if self._loop_fn is None:
            self._loop_fn = host_loop.make_loop(self.train_step, self.pending)
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
                staged = self.train_step.staging.deserialize(serialized, iterator.element_spec)
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
        writer = (tf.summary.create_file_writer(self.model_dir.summaries_dir("train"))
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
        fn = self.step_fn() if train.compile_step else self.loop_fn()
        calls = host_loop.Calls(self.train_step, fn, self.pending, iterator, staged)
        sync_every = (train.log_every, train.checkpoint_steps, eval_every)
        step, loss, stopped_by, path = start_step, math.nan, "max_steps", None
        try:
            with SignalWatch() as signals:
                def flags() -> np.ndarray:  # this worker's SIGNAL, BUDGET, CHECKPOINT_TIME
                    return np.array([signals.received is not None, budget.spent()
                                     or evaluations.stop_requested, checkpoints.time_due()],
                                    np.float32)

                for rows, before in calls.sync_points(flags, step, max_steps, sync_every):
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
            if path is None or not path.endswith(f"-{step}"):
                path = self.save(step, calls.staged_for_save())
            evaluations.run(step, path)
        finally:
            writer.flush()
        return TrainResult(step, loss, stopped_by, path, reporter.tokens_per_sec,
                           reporter.skipped_steps)
