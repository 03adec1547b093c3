"""Training loss and dev BLEU of one training run against its minutes, as a PNG.

  python -m bench.learning_curve --log=RUN.log --output=bench/converged_small.png \
      [--pauses=RUN.pauses] [--title=...]

Reads the trainer's absl-logged lines of `python -m tf_transformer.train` (stderr:
`I1125 19:24:10.015181 ... train.py:...] step=25 loss=...` and `eval step=...
dev_loss=... dev_bleu=...`), whose timestamps give the minutes since the first
line. --pauses is a file of `pause UNIX_SECONDS` / `resume UNIX_SECONDS` lines
written while the process was stopped (SIGSTOP/SIGCONT) to free the machine for
benchmarks: paused time is taken out of the minutes, so the x axis is the run's
own time. Prints one line per evaluation and the best one.
"""

import datetime
import re

from absl import app, flags

flags.DEFINE_string("log", None, "The training run's log (stdout and stderr).")
flags.DEFINE_string("output", None, "PNG to write.")
flags.DEFINE_string("pauses", None, "Optional pause/resume record (module docstring).")
flags.DEFINE_string("title", "", "Figure title.")
flags.mark_flags_as_required(["log", "output"])
FLAGS = flags.FLAGS

_LINE = re.compile(r"^I(\d{4}) (\d\d:\d\d:\d\d\.\d+) .*\] (eval )?step=(\d+) (.*)$")


def read_log(path: str, year: int) -> tuple[list, list]:
    """(train points, eval points): (unix seconds, step, {name: value}) each."""
    train, evals = [], []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = _LINE.match(line.strip())
            if not m:
                continue
            stamp = datetime.datetime.strptime(f"{year}{m.group(1)} {m.group(2)}",
                                               "%Y%m%d %H:%M:%S.%f")
            seconds = stamp.replace(tzinfo=datetime.timezone.utc).timestamp()
            values = dict(kv.split("=", 1) for kv in m.group(5).split() if "=" in kv)
            point = (seconds, int(m.group(4)), values)
            (evals if m.group(3) else train).append(point)
    return train, evals


def read_pauses(path: str | None) -> list[tuple[float, float]]:
    """[(start, end)] intervals during which the run was stopped."""
    if not path:
        return []
    intervals, start = [], None
    with open(path) as f:
        for line in f:
            kind, seconds = line.split()[:2]
            if kind == "pause":
                start = float(seconds)
            elif kind == "resume" and start is not None:
                intervals.append((start, float(seconds)))
                start = None
    return intervals


def run_minutes(seconds: float, origin: float, pauses) -> float:
    """Minutes since `origin`, paused time before `seconds` taken out."""
    paused = sum(max(0.0, min(end, seconds) - start) for start, end in pauses if start < seconds)
    return (seconds - origin - paused) / 60


def main(argv):
    del argv
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    year = datetime.datetime.now(datetime.timezone.utc).year
    train, evals = read_log(FLAGS.log, year)
    if not train:
        raise SystemExit(f"no step= lines in {FLAGS.log}")
    pauses = read_pauses(FLAGS.pauses)
    origin = train[0][0]
    minutes = lambda s: run_minutes(s, origin, pauses)  # noqa: E731
    fig, (loss_ax, bleu_ax) = plt.subplots(1, 2, figsize=(11, 4))
    loss_ax.plot([minutes(s) for s, _, _ in train], [float(v["loss"]) for _, _, v in train],
                 ".-", markersize=2, label="training loss")
    dev_loss = [(minutes(s), float(v["dev_loss"])) for s, _, v in evals if "dev_loss" in v]
    if dev_loss:
        loss_ax.plot(*zip(*dev_loss), "o-", label="dev loss")
    loss_ax.set_title("loss per target token (label smoothing 0.1)")
    bleu = [(minutes(s), step, float(v["dev_bleu"])) for s, step, v in evals if "dev_bleu" in v]
    if bleu:
        bleu_ax.plot([m for m, _, _ in bleu], [b for _, _, b in bleu], "o-", color="C2")
    bleu_ax.set_title("dev sacreBLEU")
    for ax in (loss_ax, bleu_ax):
        ax.set_xlabel("minutes of the run (pauses excluded)")
        ax.grid(alpha=0.3)
    loss_ax.legend()
    if FLAGS.title:
        fig.suptitle(FLAGS.title)
    fig.tight_layout()
    fig.savefig(FLAGS.output, dpi=110)
    for m, step, b in bleu:
        print(f"eval minutes={m:.1f} step={step} dev_bleu={b:.2f}")
    if bleu:
        m, step, b = max(bleu, key=lambda x: x[2])
        print(f"best minutes={m:.1f} step={step} dev_bleu={b:.2f} last_minutes="
              f"{minutes(train[-1][0]):.1f} last_step={train[-1][1]} "
              f"paused_minutes={sum(e - s for s, e in pauses) / 60:.1f}")
    print(f"curve: {FLAGS.output}")


if __name__ == "__main__":
    app.run(main)
