"""Two exports measured in one process: every batch decoded by both in turn.

  python -m bench.ab_exports --a=EXPORT_A/1 --b=EXPORT_B/1 --sources=SORTED.txt \
      [--rounds=3] [--threads=1] [--batch_size=32]

Loads both SavedModels with tensorflow and tensorflow_text only (as a server
would) and decodes each batch of --sources with `serving_default`, A then B,
and B then A on the next batch, so both see the same machine at a grain of a
fraction of a second. Prints each round's seconds of each export and B/A, the median
ratio, and how many translations differ. `--threads=1`: one intra-op thread, the
serving setting of decode_peer.py. Both exports share one process, so a change in how
the runtime instantiates the graph can read differently than alone: confirm a gain
with decode_peer.py runs, one export per process (bench/results/decoding.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Callable, Sequence

Run = Callable[[list], list]


def alternate(run_a: Run, run_b: Run, batches: Sequence[list], rounds: int,
              clock: Callable[[], float] = time.perf_counter, report=print) -> dict:
    """Decodes every batch with both runs, the order swapped from one batch (and
    round) to the next. Returns {"seconds_a", "seconds_b": per round,
    "ratios": b / a per round, "median_ratio", "differ": translations that
    differ in the last round}."""
    seconds = ([], [])
    outputs = ([], [])
    for r in range(rounds):
        spent = [0.0, 0.0]
        outputs = ([], [])
        for j, batch in enumerate(batches):
            order = (0, 1) if (j + r) % 2 == 0 else (1, 0)
            for side in order:
                start = clock()
                outputs[side].append((run_a, run_b)[side](batch))
                spent[side] += clock() - start
        seconds[0].append(spent[0])
        seconds[1].append(spent[1])
        report(f"round {r} a={spent[0]:.2f}s b={spent[1]:.2f}s b/a={spent[1] / spent[0]:.3f}")
    ratios = [b / a for a, b in zip(*seconds)]
    differ = sum(x != y for a, b in zip(*outputs) for x, y in zip(a, b))
    result = {"seconds_a": seconds[0], "seconds_b": seconds[1], "ratios": ratios,
              "median_ratio": statistics.median(ratios), "differ": differ}
    report(f"median b/a={result['median_ratio']:.3f} rounds={rounds} "
           f"translations_differ={differ}")
    return result


def _serving(path: str) -> Run:
    """Our export's serving_default, called as decode_peer.py times it."""
    from bench.compare.decode_peer import load_system
    return load_system(argparse.Namespace(system="tf_transformer", model=path, threads=0))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--a", required=True, help="An export version directory (the base).")
    parser.add_argument("--b", required=True, help="The export under test.")
    parser.add_argument("--sources", required=True, help="One sentence per line, sorted by length.")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="Intra-op threads (0: default).")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    with open(args.sources, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    batches = [lines[i:i + args.batch_size] for i in range(0, len(lines), args.batch_size)]
    run_a, run_b = _serving(args.a), _serving(args.b)
    for run in (run_a, run_b):  # trace and warm up outside the timing
        run(batches[0])
        run(batches[-1])
    alternate(run_a, run_b, batches, args.rounds)


if __name__ == "__main__":
    main()
