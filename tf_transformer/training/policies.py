"""When the loop acts: "every N minutes or N steps", the stop decision, signals.

Each policy only answers a question about the step just run; the trainer
(trainer.py) acts on the answers.
"""

from __future__ import annotations

import signal
import time

from absl import logging


class Every:
    """Due every `minutes` of wall time or every `steps` steps (0 or None: never)."""

    def __init__(self, minutes: float | None = None, steps: int = 0,
                 clock=time.monotonic):
        self.minutes, self.steps, self._clock = minutes, steps, clock
        self._last = clock()

    def time_due(self) -> bool:
        return self.minutes is not None and self._clock() - self._last >= 60 * self.minutes

    def step_due(self, step: int) -> bool:
        return bool(self.steps) and step % self.steps == 0

    def due(self, step: int) -> bool:
        return self.time_due() or self.step_due(step)

    def reset(self) -> None:
        self._last = self._clock()


class Budget:
    """The --max_minutes time budget, counted from the loop's start."""

    def __init__(self, minutes: float | None, clock=time.monotonic):
        self.minutes, self._clock, self._start = minutes, clock, clock()

    def spent(self) -> bool:
        return self.minutes is not None and self._clock() - self._start >= 60 * self.minutes


class SignalWatch:
    """Records SIGTERM/SIGINT instead of dying; restores the old handlers on exit."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.received: int | None = None
        self._previous = {}

    def _on_signal(self, signum, frame):
        del frame
        logging.warning("received signal %d: checkpointing and stopping after this step", signum)
        self.received = signum

    def __enter__(self):
        self._previous = {s: signal.getsignal(s) for s in self.SIGNALS}
        for s in self.SIGNALS:
            signal.signal(s, self._on_signal)
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)


def next_sync_step(step: int, max_steps: int, every: tuple[int, ...]) -> int:
    """The first step after `step` that is a multiple of one of `every` (0s ignored),
    or `max_steps`: where the host next reads the device (trainer.py)."""
    candidates = [max_steps] + [(step // n + 1) * n for n in every if n]
    return min(candidates)
