"""One change measured alone: a benchmark alternated between two revisions.

  python -m bench.ab --base=HEAD~1 --figure=tokens_per_sec [--match='preset=small'] \
      [--key=beam,batch] [--rounds=3] -- python -m bench.train_throughput ...

Checks `--base` out into a temporary worktree (the working tree itself is the head,
uncommitted changes included) and runs the command in each, alternating B H B H ...
--rounds times, so both see the same machine load. Reads `FIGURE=value` from the output
lines containing --match (every such line: several settings give several keys) and prints
per line key the median of each side and head/base. On a shared machine only such ratios
mean anything.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, help="A git revision: the reference.")
    parser.add_argument("--figure", required=True, help="Name of the `name=value` to compare.")
    parser.add_argument("--match", default="", help="Only output lines containing this.")
    parser.add_argument("--key", default="",
                        help="Comma list of the fields naming a setting (beam,batch); default: "
                             "the non-numeric `name=value` fields and bare words.")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the benchmark.")
    args = parser.parse_args(argv)
    args.command = [c for c in args.command if c != "--"]
    if not args.command:
        parser.error("give the benchmark command after --")
    return args


def figures(output: str, figure: str, match: str, key_fields: str = "") -> dict[str, float]:
    """{line key: value}: the key names the line's setting, so the same setting
    matches across runs: the `key_fields` given, else the line without its
    numeric `name=value` fields."""
    found = {}
    pattern = re.compile(rf"(?:^|\s){re.escape(figure)}=([-\d.eE+]+)")
    names = [k for k in key_fields.split(",") if k]
    for line in output.splitlines():
        value = pattern.search(line)
        if value and match in line:
            words = line.split()
            if names:
                key = " ".join(w for w in words if w.split("=", 1)[0] in names)
            else:
                key = " ".join(w for w in words if not re.fullmatch(r"[\w.]+=[-\d.eE+]+", w))
            found[key or figure] = float(value.group(1))
    return found


def run(checkout: str, command: list[str]) -> str:
    env = dict(os.environ, PYTHONPATH=checkout)
    result = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True,
                            errors="replace")
    if result.returncode:
        sys.stderr.write(result.stdout[-2000:] + result.stderr[-4000:])
        raise SystemExit(f"exit status {result.returncode} in {checkout}")
    return result.stdout + result.stderr


def main(argv=None):
    args = parse_args(argv)
    base = tempfile.mkdtemp(prefix="ab_base_")
    subprocess.run(["git", "-C", REPO, "worktree", "add", "-q", "--detach", base, args.base],
                   check=True)
    try:
        venv = os.path.join(REPO, ".venv")
        if os.path.isdir(venv):
            os.symlink(venv, os.path.join(base, ".venv"))
        results = {"base": {}, "head": {}}
        for round_ in range(args.rounds):
            for side, checkout in (("base", base), ("head", REPO)):
                for key, value in figures(run(checkout, args.command), args.figure,
                                          args.match, args.key).items():
                    results[side].setdefault(key, []).append(value)
                    print(f"ab_round round={round_} side={side} {args.figure}={value:g} | {key}",
                          flush=True)
        for key in results["head"]:
            b, h = (statistics.median(results[s].get(key, [float("nan")])) for s in ("base", "head"))
            print(f"ab base={args.base} {args.figure} base={b:g} head={h:g} ratio={h / b:.3f} | {key}")
    finally:
        subprocess.run(["git", "-C", REPO, "worktree", "remove", "--force", base], check=False)


if __name__ == "__main__":
    main()
