"""`onmt-main ... train` under a wall-clock budget (runs in the OpenNMT-tf venv).

  python opennmt_train.py MINUTES [onmt-main arguments ...]

OpenNMT-tf stops by step count only. This wraps its Trainer's step generator
so the loop ends once MINUTES have passed since the first training step began,
after which OpenNMT-tf does what it does at max_step: it logs, saves the final
checkpoint and evaluates. tf_transformer's --max_minutes behaves the same way.
"""

import sys
import time

from opennmt import training
from opennmt.bin import main as onmt_main


def _with_deadline(minutes: float) -> None:
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
