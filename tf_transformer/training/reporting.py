"""What a run tells its user: the progress line and the TensorBoard scalars.

Between two log lines a window counts step calls (skipped ones included, so
ms_per_step never divides by zero), tokens and model FLOPs. The line reads

  step= loss= lr= tokens_per_sec= tokens_per_sec_per_replica= ms_per_step=
  grad_norm= skipped_steps= [loss_scale=] [model_tflops= mfu=]

loss_scale appears under mixed_float16; MFU against `peak_tflops` per replica
(given, or known for the GPU's name: `default_peak_tflops`). With a
`DivergenceWatch` every step's loss goes to it, its warning lines are logged
when due, and TensorBoard gets `unigram_loss` and `divergence_warnings`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import tensorflow as tf

from tf_transformer.training.divergence import DivergenceWatch

# Dense bfloat16/float16 tensor-core peaks (TFLOP/s, no sparsity), from the vendor sheets.
KNOWN_PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0}


def peak_for(device_name: str) -> float | None:
    """The known peak of a device name such as "NVIDIA H100 80GB HBM3"; None if unknown."""
    for key, peak in KNOWN_PEAK_TFLOPS.items():
        if key in device_name:
            return peak
    return None


def default_peak_tflops() -> float | None:
    """The peak of the first GPU when its name is known; None on CPU (no MFU)."""
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return None
    return peak_for(tf.config.experimental.get_device_details(gpus[0]).get("device_name", ""))


class ProgressReporter:
    """Accumulates each step's outputs; every `log_every` steps writes the line and scalars."""

    def __init__(self, writer, log_fn: Callable[[str], None], log_every: int, replicas: int,
                 peak_tflops: float | None = None, clock=time.monotonic,
                 divergence: DivergenceWatch | None = None):
        self.writer, self.log_fn, self.log_every = writer, log_fn, log_every
        self.divergence = divergence
        self.replicas, self.peak_tflops, self._clock = replicas, peak_tflops, clock
        self.skipped_steps = 0
        self.tokens_per_sec = 0.0
        self._reset()

    def _reset(self) -> None:
        self._start, self._calls, self._tokens, self._flops = self._clock(), 0, 0.0, 0.0

    def record(self, step: int, out: dict[str, float], skipped: bool,
               learning_rate: float | Callable[[], float],
               loss_scale: float | None | Callable[[], float | None] = None,
               force: bool = False) -> None:
        """One step call; `skipped`: the optimizer did not apply it (gradient overflow).

        `learning_rate` and `loss_scale` may be functions, called only when a line is
        written (each reads the device)."""
        self._calls += 1
        self._tokens += out["source_tokens"] + out["target_tokens"]
        self._flops += out.get("flops", 0.0)
        self.skipped_steps += int(skipped)
        if self.divergence is not None and not skipped:
            warning = self.divergence.update(step, out["loss"])
            if warning:
                self.log_fn(warning)
        if force or (not skipped and step % self.log_every == 0):
            self._emit(step, out, learning_rate, loss_scale)

    def _emit(self, step, out, learning_rate, loss_scale) -> None:
        learning_rate = learning_rate() if callable(learning_rate) else learning_rate
        loss_scale = loss_scale() if callable(loss_scale) else loss_scale
        elapsed = max(self._clock() - self._start, 1e-9)
        self.tokens_per_sec = self._tokens / elapsed
        scalars = {"loss": out["loss"], "learning_rate": learning_rate,
                   "grad_norm": out["grad_norm"], "tokens_per_sec": self.tokens_per_sec,
                   "tokens_per_sec_per_replica": self.tokens_per_sec / self.replicas,
                   "skipped_steps": float(self.skipped_steps)}
        line = (f"step={step} loss={out['loss']:.5f} lr={learning_rate:.3e} "
                f"tokens_per_sec={self.tokens_per_sec:.0f} "
                f"tokens_per_sec_per_replica={self.tokens_per_sec / self.replicas:.0f} "
                f"ms_per_step={1000 * elapsed / self._calls:.1f} "
                f"grad_norm={out['grad_norm']:.3f} skipped_steps={self.skipped_steps}")
        if loss_scale is not None:
            scalars["loss_scale"] = loss_scale
            line += f" loss_scale={loss_scale:g}"
        if self.divergence is not None:
            scalars["unigram_loss"] = self.divergence.unigram
            scalars["divergence_warnings"] = float(self.divergence.warnings)
        if self._flops:
            tflops = self._flops / elapsed / 1e12
            scalars["model_tflops"] = tflops
            line += f" model_tflops={tflops:.4g}"
            if self.peak_tflops:
                scalars["mfu"] = tflops / (self.peak_tflops * self.replicas)
                line += f" mfu={scalars['mfu']:.3f}"
        self.log_fn(line)
        with self.writer.as_default(step=step):
            for name, value in scalars.items():
                tf.summary.scalar(name, value)
        self._reset()
