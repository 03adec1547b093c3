"""The training loop of section 5, for one device, mirrored GPUs or many workers.

One optimizer step = `accum_steps` batches on every replica. The loss is the
sum of label-smoothed token losses divided by the number of non-pad target
tokens across all replicas and micro-batches, so a step is the same whatever
the replica count (tests/test_trainer.py checks 1 vs 2 replicas and
accumulation against a batch twice as large).
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import shutil
import signal
import time
from typing import Callable

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from tf_transformer.config import PAD_ID, Config
from tf_transformer.model import build_model
from tf_transformer.training import distribution, losses
from tf_transformer.training.schedule import make_optimizer


class NonFiniteLossError(RuntimeError):
    """Training produced a NaN or Inf loss; the last good checkpoint is kept."""


@dataclasses.dataclass
class TrainResult:
    step: int
    loss: float
    stopped_by: str  # "max_steps", "max_minutes" or "signal"
    checkpoint: str | None
    tokens_per_sec: float


class Trainer:
    """Owns the model, optimizer, checkpoints and the distributed step function."""

    def __init__(self, config: Config, model_dir: str, strategy: tf.distribute.Strategy,
                 keep_checkpoints: int | None = None):
        self.config = config
        self.model_dir = model_dir
        self.strategy = strategy
        self.chief = distribution.is_chief(strategy)
        train = config.train
        dtype = None if train.dtype == "float32" else train.dtype
        # The same initial weights and dropout masks for the same seed. Keras draws
        # its default seeds from Python's `random`; tf.random.set_seed is avoided on
        # purpose: it clears TensorFlow's kernel cache, which destroys live
        # SentencePiece resources (tensorflow-text) created before this point.
        random.seed(train.seed)
        np.random.seed(train.seed)
        with strategy.scope():
            self.model = build_model(config.model, dtype=dtype)
            optimizer = make_optimizer(train, config.model.d_model, pre_reduced=True)
            if train.dtype == "mixed_float16":
                optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
            self.optimizer = optimizer
            self.optimizer.build(self.model.trainable_variables)
        self.checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer)
        self.manager = tf.train.CheckpointManager(
            self.checkpoint, self._checkpoint_dir(),
            max_to_keep=keep_checkpoints or train.keep_checkpoints)
        # Built once: a new tf.function per trace would compile the XLA cluster again.
        self._grads_fn = (tf.function(self._grads, jit_compile=True) if train.jit_compile
                          else self._grads)
        self._step_fn = None
        self._stop_signal = None

    # -- checkpoints ---------------------------------------------------------
    def _checkpoint_dir(self) -> str:
        """Non-chief workers take part in every save but write to a scratch dir."""
        if self.chief:
            return self.model_dir
        task_id = self.strategy.cluster_resolver.task_id
        return os.path.join(self.model_dir, f".worker_{task_id}_scratch")

    @property
    def step(self) -> int:
        return int(self.optimizer.iterations.numpy())

    def restore(self) -> int:
        """Restores the latest checkpoint of model_dir, if any; returns the step."""
        path = tf.train.latest_checkpoint(self.model_dir)
        if path:
            self.checkpoint.restore(path).assert_existing_objects_matched()
            logging.info("restored %s at step %d", path, self.step)
        return self.step

    def save(self) -> str:
        path = self.manager.save(checkpoint_number=self.step)
        if not self.chief:
            shutil.rmtree(self._checkpoint_dir(), ignore_errors=True)
        logging.info("saved checkpoint %s", path)
        return path

    # -- the step ------------------------------------------------------------
    def _grads(self, batch):
        """Sums (not means) over one micro-batch: gradients, loss, tokens."""
        with tf.GradientTape() as tape:
            states = self.model.states({"source": batch["source"], "target_in": batch["target_in"]},
                                       training=True)
            labels = batch["target_out"]
            if not self.config.train.jit_compile:
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

    def _replica_step(self, batches):
        grads_fn = self._grads_fn
        grads, loss_sum, tokens, source_tokens = grads_fn(batches[0])
        for batch in batches[1:]:
            more, l, t, s = grads_fn(batch)
            grads = [a + b for a, b in zip(grads, more)]
            loss_sum, tokens, source_tokens = loss_sum + l, tokens + t, source_tokens + s
        context = tf.distribute.get_replica_context()
        loss_sum, tokens, source_tokens = context.all_reduce(
            tf.distribute.ReduceOp.SUM, [loss_sum, tokens, source_tokens])
        grads = context.all_reduce(tf.distribute.ReduceOp.SUM, grads)
        denominator = tf.maximum(tokens, 1.0)
        grads = [g / tf.cast(denominator, g.dtype) for g in grads]
        grad_norm = tf.linalg.global_norm(grads)
        if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
            grad_norm = grad_norm / tf.cast(self.optimizer.dynamic_scale, grad_norm.dtype)
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
        return {"loss": loss_sum / denominator, "target_tokens": tokens,
                "source_tokens": source_tokens, "grad_norm": grad_norm}

    def step_fn(self) -> Callable:
        """tf.function(iterator) -> dict of float32 scalars, one optimizer step."""
        if self._step_fn is None:
            accum = self.config.train.accum_steps

            # reduce_retracing: one graph for every bucket shape (XLA, when on,
            # still compiles each concrete shape once).
            @tf.function(reduce_retracing=True)
            def step(iterator):
                batches = tuple(next(iterator) for _ in range(accum))
                out = self.strategy.run(self._replica_step, args=(batches,))
                # Values are all-reduced, hence equal on every replica.
                return {k: self.strategy.experimental_local_results(v)[0] for k, v in out.items()}

            self._step_fn = step
        return self._step_fn

    def learning_rate(self) -> float:
        lr = self.optimizer.learning_rate
        return float(lr.numpy() if hasattr(lr, "numpy") else lr)

    # -- the loop --------------------------------------------------------------
    def _on_signal(self, signum, frame):
        del frame
        logging.warning("received signal %d: checkpointing and stopping after this step", signum)
        self._stop_signal = signum

    def train(self, dataset_fn, max_steps: int, max_minutes: float | None = None,
              evaluate_fn: Callable[[keras.Model], dict] | None = None,
              eval_every: int = 0, log_fn: Callable[[str], None] = logging.info) -> TrainResult:
        """Trains until `max_steps` (global), `max_minutes`, or SIGTERM/SIGINT.

        Checkpoints every `checkpoint_minutes` and/or `checkpoint_steps`, at a
        signal and at the end. On resume the data pipeline starts a new pass
        with the seed offset by the restored step (a documented reshuffle).
        """
        train = self.config.train
        start_step = self.restore()
        writer = (tf.summary.create_file_writer(os.path.join(self.model_dir, "train"))
                  if self.chief else tf.summary.create_noop_writer())
        iterator = iter(self.strategy.distribute_datasets_from_function(dataset_fn(start_step)))
        step_fn = self.step_fn()
        previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
        for s in previous:
            signal.signal(s, self._on_signal)
        started = last_log_time = last_checkpoint_time = time.time()
        last_log_step, window_tokens = start_step, 0.0
        loss, stopped_by, path, tokens_per_sec = math.nan, "max_steps", None, 0.0
        try:
            while self.step < max_steps:
                if max_minutes is not None and time.time() - started >= 60 * max_minutes:
                    stopped_by = "max_minutes"
                    break
                out = step_fn(iterator)
                loss = float(out["loss"])
                step = self.step
                if not math.isfinite(loss):
                    raise NonFiniteLossError(
                        f"loss is {loss} at step {step}; stopping without saving, the last good "
                        f"checkpoint is {tf.train.latest_checkpoint(self.model_dir)}")
                window_tokens += float(out["source_tokens"] + out["target_tokens"])
                if step % train.log_every == 0 or step == max_steps:
                    now = time.time()
                    elapsed = max(now - last_log_time, 1e-9)
                    tokens_per_sec = window_tokens / elapsed
                    lr = self.learning_rate()
                    log_fn(f"step={step} loss={loss:.5f} lr={lr:.3e} "
                           f"tokens_per_sec={tokens_per_sec:.0f} "
                           f"ms_per_step={1000 * elapsed / (step - last_log_step):.1f} "
                           f"grad_norm={float(out['grad_norm']):.3f}")
                    with writer.as_default(step=step):
                        tf.summary.scalar("loss", loss)
                        tf.summary.scalar("learning_rate", lr)
                        tf.summary.scalar("grad_norm", out["grad_norm"])
                        tf.summary.scalar("tokens_per_sec", tokens_per_sec)
                    last_log_time, last_log_step, window_tokens = now, step, 0.0
                due_time = time.time() - last_checkpoint_time >= 60 * train.checkpoint_minutes
                due_step = train.checkpoint_steps and step % train.checkpoint_steps == 0
                if due_time or due_step:
                    path = self.save()
                    last_checkpoint_time = time.time()
                    if evaluate_fn is not None and eval_every == 0:
                        self._evaluate(evaluate_fn, writer, log_fn)
                if evaluate_fn is not None and eval_every and step % eval_every == 0:
                    self._evaluate(evaluate_fn, writer, log_fn)
                if self._stop_signal is not None:
                    stopped_by = "signal"
                    break
            if path is None or not path.endswith(f"-{self.step}"):
                path = self.save()
            if evaluate_fn is not None:
                self._evaluate(evaluate_fn, writer, log_fn)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            writer.flush()
        return TrainResult(self.step, loss, stopped_by, path, tokens_per_sec)

    def _evaluate(self, evaluate_fn, writer, log_fn):
        metrics = evaluate_fn(self.model)
        log_fn("eval step=%d %s" % (self.step, " ".join(f"{k}={v:.4f}" for k, v in metrics.items())))
        with writer.as_default(step=self.step):
            for name, value in metrics.items():
                tf.summary.scalar(name, value)


def dev_loss_fn(dataset: tf.data.Dataset, label_smoothing: float) -> Callable[[keras.Model], dict]:
    """Mean label-smoothed loss per non-pad token over a finite dev dataset."""

    @tf.function(reduce_retracing=True)
    def sums(model, batch):
        logits = model({"source": batch["source"], "target_in": batch["target_in"]}, training=False)
        loss, weights = losses.smoothed_cross_entropy(logits, batch["target_out"], label_smoothing)
        return tf.reduce_sum(loss), tf.reduce_sum(weights)

    def evaluate(model):
        total, tokens = 0.0, 0.0
        for batch in dataset:
            loss, weight = sums(model, batch)
            total, tokens = total + float(loss), tokens + float(weight)
        return {"dev_loss": total / max(tokens, 1.0)}

    return evaluate
