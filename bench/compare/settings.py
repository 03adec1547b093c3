"""OpenNMT-tf's schedule in the protocol: a setting of its dev-split sweep.

A settings file holds one setting a line, `name  --flag=value ...` (`#` starts a comment).
OpenNMT-tf's take --warmup_steps, --learning_rate_scale (the Noam scale) and --pre_norm.
The protocol trains OpenNMT-tf with OPENNMT_SETTING of OPENNMT_SWEEP, the best on dev of
that sweep (run_protocol.py --opennmt_setting picks another).
"""

import os
import shlex

# Ours trains with its `small` preset's schedule, the best of its own dev-split sweep
# (bench/results/quality.md); OpenNMT-tf with the best setting of the same sweep run for
# it on the same dev pairs:
OPENNMT_SWEEP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "opennmt_sweep.txt")
OPENNMT_SETTING = "onmt_w1600_pre"


def read_settings(path: str) -> list[tuple[str, list[str]]]:
    """(name, flags) per non-comment line."""
    settings = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                name, *flags = shlex.split(line)
                settings.append((name, flags))
    return settings


def opennmt_schedule(flags: list[str]) -> dict:
    """An OpenNMT-tf setting's flags -> trainings.train_opennmt's schedule."""
    schedule = {}
    for flag in flags:
        name, _, value = flag.lstrip("-").partition("=")
        if name == "warmup_steps":
            schedule[name] = int(value)
        elif name == "learning_rate_scale":
            schedule[name] = float(value)
        elif name == "pre_norm":
            schedule[name] = True
        else:
            raise ValueError(f"OpenNMT-tf settings take --warmup_steps, --learning_rate_scale "
                             f"and --pre_norm, not {flag}")
    return schedule
