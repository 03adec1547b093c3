"""The protocol's training logs: each trainer's lines parsed into throughput and learning
curves, and run_logged's timestamped logs read back."""

import re
import statistics


def steady(values):
    """Median of the logged throughput windows after the first (tracing, warm-up)."""
    values = list(values)
    return statistics.median(values[1:] or values) if values else None


def parse_opennmt_train(lines) -> dict:
    """OpenNMT-tf's training log, (seconds, line) pairs -> throughput and learning curves."""
    steps = [(t, float(m.group(2)), float(m.group(1)), float(m.group(3))) for t, l in lines
             for m in [re.search(r"Step = \d+ ; steps/s = ([\d.]+), tokens/s = (\d+) .*"
                                 r"Loss = ([\d.]+)", l)] if m]  # (t, tokens/s, steps/s, loss)
    dev = [(t, float(m.group(1))) for t, l in lines for m in
           [re.search(r"Evaluation result for step \d+: loss = ([\d.]+)", l)] if m]
    last = re.findall(r"Step = (\d+) ;", "\n".join(l for _, l in lines))
    return {"tokens_per_sec": steady(tokens for _, tokens, _, _ in steps),
            "tokens_per_step": steady(tokens / rate for _, tokens, rate, _ in steps if rate),
            "last_step": int(last[-1]) if last else 0,
            "curve_train": [(t, loss) for t, _, _, loss in steps], "curve_dev": dev}


def parse_ours_train(lines) -> dict:
    """Our trainer's log, (seconds, line) pairs -> throughput and learning curves."""
    steps = [(t, float(m.group(2)), float(m.group(3)), float(m.group(1))) for t, l in lines
             for m in [re.search(r"^step=\d+ loss=([\d.]+) .*tokens_per_sec=(\d+) .*"
                                 r"ms_per_step=([\d.]+)", l)] if m]  # (t, tokens/s, ms, loss)
    dev = [(t, float(m.group(1))) for t, l in lines for m in
           [re.search(r"^eval step=\d+ dev_loss=([\d.]+)", l)] if m]
    return {"tokens_per_sec": steady(tokens for _, tokens, _, _ in steps),
            "tokens_per_step": steady(tokens * ms / 1000 for _, tokens, ms, _ in steps),
            "curve_train": [(t, loss) for t, _, _, loss in steps], "curve_dev": dev}


def read_logged(log_path):
    """A run_logged log back as (seconds, line) pairs (to re-read a finished run)."""
    with open(log_path, encoding="utf-8", errors="replace") as f:
        return [(float(head), rest.rstrip("\n")) for head, _, rest in
                (line.lstrip().partition(" ") for line in f) if head.replace(".", "", 1).isdigit()]
