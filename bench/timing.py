"""Timing helpers the benchmarks share: the machine's matmul peak (train_throughput and the
side-by-side protocol's MFU) and the op statistics of a profiler trace (decode --profile)."""

import glob
import json
import time


def matmul_peak(dtype, size=2048, repeats=8) -> float:
    """Best-of-N FLOP/s of a size^3 matmul through TensorFlow."""
    import tensorflow as tf

    a = tf.cast(tf.random.normal([size, size]), dtype)
    b = tf.cast(tf.random.normal([size, size]), dtype)
    matmul = tf.function(tf.matmul)
    matmul(a, b).numpy()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(a, b).numpy()
        best = min(best, time.perf_counter() - start)
    return 2 * size ** 3 / best


def op_stats(logdir: str) -> list[dict]:
    """Per-op rows (type, operation, total_self_time, ...) of the profiler trace
    in `logdir`, host side. Needs the `xprof` package (not a runtime dependency)."""
    from xprof.convert import raw_to_tool_data

    paths = glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)
    data, _ = raw_to_tool_data.xspace_to_tool_data(paths, "framework_op_stats", {})
    table = json.loads(data)[0]  # the host table
    columns = [c["id"] for c in table["cols"]]
    return [dict(zip(columns, [cell.get("v") for cell in row["c"]])) for row in table["rows"]]
