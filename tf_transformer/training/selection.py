"""Model selection: the N best checkpoints by dev score, kept apart, and early stopping.

MODEL_DIR/best/ (model_dir/layout.py reads and writes it) holds copies of the rolling
checkpoints that scored best (the full training checkpoint, so a best one can
also be resumed from), `best.json` (the record: every evaluation, and the kept
ones best first) and a TensorFlow `checkpoint` index whose latest entry is the
best, so `tf.train.latest_checkpoint(MODEL_DIR/best)` is the best checkpoint too.

The score is dev BLEU when the evaluation has it, else minus the dev loss.
Writes are ordered for crashes: the files are copied first, then the record
is replaced atomically, then dropped copies are deleted; files the record does
not name are removed at the next update. A resumed run reads the record, so the
best list and the early-stopping count survive restarts.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from absl import logging

from tf_transformer.model_dir import ModelDir


def score_of(metrics: dict) -> tuple[str, float]:
    """(metric name, higher-is-better score): dev BLEU, else minus the dev loss."""
    if "dev_bleu" in metrics:
        return "dev_bleu", float(metrics["dev_bleu"])
    if "dev_loss" in metrics:
        return "dev_loss", -float(metrics["dev_loss"])
    raise ValueError(f"no dev_bleu or dev_loss to select by in {sorted(metrics)}")


class ModelSelection:
    """Keeps the `keep_best` best checkpoints and counts evaluations without improvement.

    `update` is called after each evaluation with the checkpoint of that step.
    Only the chief writes; every worker keeps the same counts, and a stop request
    travels in the step's all-reduce (trainer.py), so workers stop together.
    `start_step`: evaluations recorded after it (a run restored from an older
    checkpoint) are forgotten.
    """

    def __init__(self, model_dir: ModelDir, keep_best: int, early_stop: int = 0,
                 chief: bool = True, start_step: int = 0,
                 log_fn: Callable[[str], None] = logging.info):
        self.model_dir = model_dir
        self.keep_best, self.early_stop, self.chief = keep_best, early_stop, chief
        self.log_fn = log_fn
        record = self.model_dir.read_record()
        self.metric = record["metric"]
        self.evaluations = [e for e in record["evaluations"] if e["step"] <= start_step]
        self.best = [e for e in record["best"] if e["step"] <= start_step]
        self.stop_requested = False

    @property
    def best_score(self) -> float | None:
        scores = [e["score"] for e in self.evaluations]
        return max(scores) if scores else None

    @property
    def since_best(self) -> int:
        """Evaluations after the best one (the first best, if tied)."""
        scores = [e["score"] for e in self.evaluations]
        return len(scores) - 1 - scores.index(max(scores)) if scores else 0

    def update(self, step: int, metrics: dict, checkpoint: str | None) -> bool:
        """Records one evaluation; returns whether it is a new best. Writes on the chief."""
        metric, score = score_of(metrics)
        if self.metric not in (None, metric):
            raise ValueError(f"{self.model_dir.best_dir} selects by {self.metric}, this run by "
                             f"{metric}: give the same dev data and --dev_bleu_sentences or a new "
                             "model_dir")
        self.metric = metric
        improved = self.best_score is None or score > self.best_score
        self.evaluations = [e for e in self.evaluations if e["step"] != step]
        self.evaluations.append({"step": step, "score": score,
                                 **{k: float(v) for k, v in metrics.items()}})
        entry = {"step": step, "score": score, metric: float(metrics[metric])}
        keep = (self.keep_best and checkpoint is not None
                and (len(self.best) < self.keep_best or score > self.best[-1]["score"]))
        if keep:
            entry["checkpoint"] = os.path.basename(checkpoint)
            self.best = sorted([e for e in self.best if e["step"] != step] + [entry],
                               key=lambda e: (-e["score"], e["step"]))[:self.keep_best]
        if self.chief:
            self._write(checkpoint if keep else None)
        if improved:
            self.log_fn(f"best step={step} {metric}={metrics[metric]:.4f}")
        elif self.early_stop and self.since_best >= self.early_stop:
            best = self.evaluations[-1 - self.since_best]
            self.log_fn(f"early stop: {metric} has not improved for {self.since_best} "
                        f"evaluations (best {best[metric]:.4f} at step {best['step']})")
            self.stop_requested = True
        return improved

    def _write(self, new_checkpoint: str | None) -> None:
        record = {"metric": self.metric, "best": self.best, "evaluations": self.evaluations}
        self.model_dir.write_record(record, new_checkpoint)
