"""`onmt-main ... train` under a wall-clock budget (runs in the OpenNMT-tf venv).

  python opennmt_train.py MINUTES [onmt-main arguments ...]

The private `opennmt.training.Trainer._steps` wrapped to end MINUTES after the first step;
`check_patchable` exits with a line starting PATCH_ERROR when the installed release no longer
fits (bench/compare/README.md, "The OpenNMT-tf patch").
"""

import inspect
import sys
import time

import opennmt
from opennmt import training
from opennmt.bin import main as onmt_main

WRITTEN_FOR = "2.32.0"
PATCH_ERROR = "opennmt_train.py: cannot bound OpenNMT-tf's training by minutes"


def check_patchable(trainer, version: str) -> None:
    """Exits (SystemExit, a clear message) unless `trainer` (opennmt.training.Trainer) still
    has what the deadline relies on; warns when it passes on another release than WRITTEN_FOR."""
    problems = []
    steps = getattr(trainer, "_steps", None)
    if steps is None:
        problems.append("Trainer has no attribute `_steps`")
    elif not inspect.isgeneratorfunction(steps):
        problems.append("Trainer._steps is no longer a generator function")
    try:
        call = inspect.getsource(trainer.__call__)
    except (OSError, TypeError):  # no source installed: that check cannot be made
        call = None
    if call is not None and "self._steps(" not in call:
        problems.append("Trainer.__call__ no longer iterates self._steps(...)")
    overriding = sorted(c.__name__ for c in _subclasses(trainer) if "_steps" in vars(c))
    if overriding:
        problems.append(f"_steps is overridden in {', '.join(overriding)}, which the patch would miss")
    if problems:
        raise SystemExit(f"{PATCH_ERROR} (OpenNMT-tf {version}): {'; '.join(problems)}. "
                         f"The patch replaces the private opennmt.training.Trainer._steps and was "
                         f"written against OpenNMT-tf {WRITTEN_FOR} (bench/compare/README.md, "
                         f"\"The OpenNMT-tf patch\").")
    if version != WRITTEN_FOR:
        print(f"warning: OpenNMT-tf {version}: the wall-clock patch was written against "
              f"{WRITTEN_FOR}; its checks pass", flush=True)


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _with_deadline(minutes: float) -> None:
    check_patchable(training.Trainer, getattr(opennmt, "__version__", "unknown"))
    steps = training.Trainer._steps

    def _steps(self, *args, **kwargs):
        deadline = time.time() + 60.0 * minutes
        for loss in steps(self, *args, **kwargs):
            yield loss
            if time.time() >= deadline:
                print(f"stopped_by=max_minutes minutes={minutes}", flush=True)
                return

    training.Trainer._steps = _steps


if __name__ == "__main__":
    _with_deadline(float(sys.argv[1]))
    sys.argv = ["onmt-main"] + sys.argv[2:]
    onmt_main.main()
