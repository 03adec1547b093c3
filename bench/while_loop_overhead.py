"""What a graph-mode tf.while_loop iteration costs besides its ops: extra loop
variables, and variable reads inside the body against reads hoisted out of it.

  python -m bench.while_loop_overhead [--iterations=2000]

Why: the search's loop carries 88 loop variables (caches, state, captured
weights) and reads 58 weights every step; this says whether either is a cost.
Prints one `while_loop` line per setting (microseconds per iteration, best of 5).
"""

import time

from absl import app, flags

ITERATIONS = flags.DEFINE_integer("iterations", 2000, "Loop iterations per run.")


def _loop(extra_vars: int, reads: int, hoist: bool, weights, n: int):
    import tensorflow as tf

    @tf.function
    def run(x):
        extras = [tf.zeros([4, 64]) + i for i in range(extra_vars)]
        hoisted = [w.read_value() for w in weights[:reads]] if hoist else None

        def body(i, x, *carried):
            values = hoisted if hoist else [w.read_value() for w in weights[:reads]]
            for value in values:  # the same three small ops per weight either way
                x = x + value[0, 0] * 0.0
            return (i + 1, x * 0.5) + tuple(carried)

        return tf.while_loop(lambda i, *_: i < n, body, (tf.constant(0), x) + tuple(extras))[1]

    return run


def main(argv):
    del argv
    import tensorflow as tf

    n = ITERATIONS.value
    weights = [tf.Variable(tf.random.normal([256, 256])) for _ in range(58)]
    x = tf.zeros([4])
    for name, extra_vars, reads, hoist in [("empty", 0, 0, False), ("88_loop_vars", 86, 0, False),
                                           ("58_reads_in_body", 0, 58, False),
                                           ("58_reads_hoisted", 0, 58, True)]:
        run = _loop(extra_vars, reads, hoist, weights, n)
        run(x).numpy()
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            run(x).numpy()
            best = min(best, time.perf_counter() - start)
        print(f"while_loop setting={name} us_per_iteration={best / n * 1e6:.1f}")


if __name__ == "__main__":
    app.run(main)
