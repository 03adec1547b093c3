"""Divergence: a training loss that stops falling at the level of a unigram model.

A model that ignores its inputs can still learn the target's token frequencies:
its best loss is the cross-entropy of the unigram distribution, here under the
trainer's label smoothing (losses.py: 1 - eps on the label, eps / (V - 1) on
every other token). A post-norm Transformer whose learning rate is too high
collapses onto that level and stays there; a learning one goes below it. The
watch warns when the loss has stayed at or above that level for a window of
steps without falling, so the failure shows in the log while training, not at
test time. Healthy runs also rest at that level for a while early on, until
the learning rate is high enough; so only steps after `first_step` (the
trainer passes the end of the warmup: the rate only falls after it) count.
"""

from __future__ import annotations

import collections
import itertools

import numpy as np
import tensorflow as tf

from tf_transformer.config import EOS_ID

TOLERANCE = 0.1  # nats: "at the level" and "not falling" both within this
SAMPLE_SENTENCES = 10000


def unigram_loss(counts: np.ndarray, label_smoothing: float) -> float:
    """The smoothed loss of the best input-independent model, in nats per token.

    counts: [vocab] target token counts (EOS included). The smoothed target
    averaged over tokens is q = (1 - eps) p + eps (1 - p) / (V - 1); a constant
    prediction r costs sum_w q(w) (-log r(w)), least at r = q: the entropy of q.
    """
    counts = np.asarray(counts, np.float64)
    p = counts / counts.sum()
    q = (1.0 - label_smoothing) * p + label_smoothing * (1.0 - p) / (len(p) - 1)
    q = q[q > 0]
    return float(-(q * np.log(q)).sum())


def target_counts(targets: list[str], tokenizer, vocab_size: int) -> np.ndarray:
    """[vocab_size] int64 counts of the target tokens of `targets`, one EOS per sentence."""
    ids = tokenizer.tokenize(tf.constant(targets)).flat_values.numpy()
    counts = np.bincount(ids, minlength=vocab_size).astype(np.int64)
    counts[EOS_ID] += len(targets)
    return counts


def target_sample(corpus, max_sentences: int = SAMPLE_SENTENCES) -> list[str]:
    """Up to `max_sentences` targets: evenly spaced from a Corpus, the first of a stream."""
    if hasattr(corpus, "targets"):
        targets = corpus.targets
        stride = max(1, len(targets) // max_sentences)
        return targets[::stride][:max_sentences]
    texts = corpus.texts()  # StreamedCorpus: source, target, source, ...
    return list(itertools.islice(texts, 1, 2 * max_sentences, 2))


def corpus_unigram_loss(corpus, tokenizer, label_smoothing: float,
                        max_sentences: int = SAMPLE_SENTENCES) -> float:
    """unigram_loss of a sample of the corpus's targets (train.py)."""
    counts = target_counts(target_sample(corpus, max_sentences), tokenizer, tokenizer.vocab_size)
    return unigram_loss(counts, label_smoothing)


class DivergenceWatch:
    """Warns when the loss is flat at or above the unigram level for `window` steps.

    Over the last `window` losses of steps after `first_step`: the second
    half's mean is at least `unigram - tolerance` and lower than the first
    half's by less than `tolerance`. Warns at most once per window; `warnings`
    counts them.
    """

    def __init__(self, unigram: float, window: int, first_step: int = 0,
                 tolerance: float = TOLERANCE):
        if window < 2:
            raise ValueError(f"window must be >= 2 steps, got {window}")
        self.unigram, self.window, self.tolerance = unigram, window, tolerance
        self.first_step = first_step
        self._losses: collections.deque = collections.deque(maxlen=window)
        self._quiet_until = 0
        self.warnings = 0

    def update(self, step: int, loss: float) -> str | None:
        """One step's loss; returns the warning line when one is due."""
        if step <= self.first_step:
            return None
        self._losses.append(loss)
        if len(self._losses) < self.window or step < self._quiet_until:
            return None
        losses = list(self._losses)
        half = self.window // 2
        before, now = float(np.mean(losses[:half])), float(np.mean(losses[half:]))
        if now < self.unigram - self.tolerance or before - now >= self.tolerance:
            return None
        self.warnings += 1
        self._quiet_until = step + self.window
        where = "at" if now <= self.unigram + self.tolerance else "above"
        return (f"warning: diverged? loss {now:.3f} has stayed {where} the unigram level "
                f"{self.unigram:.3f} for {self.window} steps (step {step}; it fell "
                f"{max(before - now, 0.0):.3f} over them): a lower learning rate "
                "(--learning_rate_scale, --warmup_steps) or --pre_norm may help")
