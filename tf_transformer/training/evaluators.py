"""Evaluations during training: dev loss, and when to run them.

An evaluator is `model -> {"name": float}` (dev loss here, dev BLEU in
tf_transformer/cli/evaluation.py; both split over replicas and workers with a
`distribution.Shards`); `Evaluations` runs one at every checkpoint
(eval_every=0) or every `eval_every` steps, and once at the end (unless that
step was just evaluated), logging a line and writing the scalars to
TensorBoard; with a `ModelSelection` it hands each result on (best/, early stop).
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf

from tf_transformer.training import losses
from tf_transformer.training.selection import ModelSelection

Evaluator = Callable[[keras.Model], dict]


def dev_loss_fn(dataset: tf.data.Dataset | Callable[[tf.distribute.InputContext], tf.data.Dataset],
                label_smoothing: float, shards=None) -> Evaluator:
    """Mean label-smoothed loss per non-pad token over a finite dev dataset.

    With `shards` (distribution.Shards), `dataset` is a function of an input
    context and each replica of each worker sums the loss and tokens of its own
    shard on its device; the sums are added over every worker, so the mean is
    one device's (up to the order of float32 additions).
    """

    @tf.function(autograph=False, reduce_retracing=True)
    def sums(model, batch):
        logits = model({"source": batch["source"], "target_in": batch["target_in"]}, training=False)
        loss, weights = losses.smoothed_cross_entropy(logits, batch["target_out"], label_smoothing)
        return tf.reduce_sum(loss), tf.reduce_sum(weights)

    def shard_sums(model, shard_dataset) -> list[float]:
        total, tokens = tf.constant(0.0), tf.constant(0.0)
        for batch in shard_dataset:
            loss, weight = sums(model, batch)
            total, tokens = total + loss, tokens + weight
        return [float(total), float(tokens)]

    def evaluate(model):
        if shards is None:
            total, tokens = shard_sums(model, dataset)
        else:
            per_shard = shards.map(lambda shard: shard_sums(model, dataset(
                tf.distribute.InputContext(shards.count, shard, 1))))
            total, tokens = shards.sum(np.sum(per_shard, axis=0))
        return {"dev_loss": total / max(tokens, 1.0)}

    return evaluate


class Evaluations:
    """Runs `evaluate_fn` at checkpoints (eval_every=0) or every `eval_every` steps.

    With a `selection`, an evaluation step off the checkpoint schedule also
    needs a checkpoint (`wants_checkpoint`), so the best one can be kept.
    """

    def __init__(self, evaluate_fn: Evaluator | None, eval_every: int, model: keras.Model,
                 writer, log_fn: Callable[[str], None],
                 selection: ModelSelection | None = None):
        self.evaluate_fn, self.eval_every = evaluate_fn, eval_every
        self.model, self.writer, self.log_fn = model, writer, log_fn
        self.selection = selection if evaluate_fn is not None else None
        self.last_step: int | None = None

    @property
    def stop_requested(self) -> bool:
        """Early stopping: N evaluations without improvement (selection.py)."""
        return self.selection is not None and self.selection.stop_requested

    def wants_checkpoint(self, step: int) -> bool:
        return (self.selection is not None and bool(self.selection.keep_best)
                and bool(self.eval_every) and step % self.eval_every == 0)

    def after_step(self, step: int, checkpoint: str | None) -> None:
        """`checkpoint`: the path saved at this step, or None."""
        if self.evaluate_fn is None:
            return
        saved = checkpoint is not None
        if (saved and not self.eval_every) or (self.eval_every and step % self.eval_every == 0):
            self.run(step, checkpoint)

    def run(self, step: int, checkpoint: str | None = None) -> None:
        if self.evaluate_fn is None or step == self.last_step:
            return
        self.last_step = step
        metrics = self.evaluate_fn(self.model)
        self.log_fn(f"eval step={step} " + " ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
        with self.writer.as_default(step=step):
            for name, value in metrics.items():
                tf.summary.scalar(name, value)
        if self.selection is not None:
            self.selection.update(step, metrics, checkpoint)
