"""tf.math.top_k against decoding/top_k.chunked_top_k on beam search's rows.

  python -m bench.top_k [--rows=32,8,1] [--vocab=8000] [--beam=4] [--rounds=5]

Each step of the search takes the top `beam` of beam * vocab candidates per
sentence. Prints microseconds per call, graph mode and XLA, both functions
alternated in every round (medians of the rounds), and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import tensorflow as tf

from tf_transformer.search.top_k import chunked_top_k


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="32,8,1")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200, help="Calls per timed round.")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    k = args.beam
    functions = {"top_k": lambda v: tf.math.top_k(v, k=k), "chunked": lambda v: chunked_top_k(v, k)}
    for rows in map(int, args.rows.split(",")):
        values = tf.random.stateless_normal([rows, args.beam * args.vocab], seed=[rows, 0])
        for jit in (False, True):
            compiled = {name: tf.function(f, jit_compile=jit) for name, f in functions.items()}

            for f in compiled.values():  # trace and compile outside the timing
                f(values)[0].numpy()
            times = {name: [] for name in compiled}
            for _ in range(args.rounds):
                for name, f in compiled.items():
                    start = time.perf_counter()
                    for _ in range(args.calls):
                        out = f(values)
                    out[0].numpy()
                    times[name].append(time.perf_counter() - start)
            times = {name: statistics.median(t) for name, t in times.items()}
            us = {name: 1e6 * t / args.calls for name, t in times.items()}
            print(f"top_k rows={rows} n={args.beam * args.vocab} k={k} xla={jit} "
                  f"top_k_us={us['top_k']:.1f} chunked_us={us['chunked']:.1f} "
                  f"speedup={us['top_k'] / us['chunked']:.2f}", flush=True)


if __name__ == "__main__":
    main()
