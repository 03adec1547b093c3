"""What a binary does to its process: settings before TensorFlow is imported, and its exit.

The library sets nothing at import: a program that imports tf_transformer keeps
its own environment. Each binary (train, translate, evaluate, score, average_checkpoints,
export, summary, presets, data.vocab, data.corpus_stats) calls `apply()` first in its
main, before its first TensorFlow import, because TensorFlow reads these variables once,
at import.

  TF_ENABLE_ONEDNN_OPTS=1  TensorFlow's oneDNN kernels, only where the CPU runs
      the model (no GPU visible). The stock wheel turns them on by itself only
      on CPUs with AVX-512 VNNI/BF16 or AMX; on an AVX2/FMA CPU its Eigen kernels
      are built without FMA and oneDNN doubles the products' throughput
      (BUILD.md, performance decisions). On a GPU machine the CPU runs only the
      input pipeline and TensorFlow's own default stands.

Whether a GPU is visible is decided here without TensorFlow (it is not imported
yet): an NVIDIA device node (/dev/nvidia0, ...) and CUDA_VISIBLE_DEVICES not
hiding every device ("" or -1). A variable the user set is left as it is.

When its main has returned, a binary leaves without the interpreter's teardown
(`exit_now`): with TensorFlow imported, tearing the interpreter down adds 1.4-3.3 s
(median 2.5 s) to every command, a quarter of a short translate's ~10 s
(bench/results/tests.md, 2026-11-29), and does nothing a finished binary needs (its
files are closed, its summaries flushed; the streams and logs are flushed here). The
tests run most binaries in their own process (tests/binary_fixtures.py), where main
returns and nothing exits. A worker of a multi-worker
cluster (TF_CONFIG set) leaves the normal way: its peers may still be reading its last
collective messages.
"""

from __future__ import annotations

import logging
import os
import re
import sys

DEFAULTS = {"TF_ENABLE_ONEDNN_OPTS": "1"}
_NVIDIA_DEVICE = re.compile(r"nvidia\d+$")


def gpu_visible(environ=os.environ, dev_dir: str = "/dev") -> bool:
    """Whether TensorFlow would see a GPU: a /dev/nvidiaN node, not hidden by
    CUDA_VISIBLE_DEVICES."""
    hidden = environ.get("CUDA_VISIBLE_DEVICES")
    if hidden is not None and hidden.strip() in ("", "-1"):
        return False
    try:
        return any(_NVIDIA_DEVICE.match(name) for name in os.listdir(dev_dir))
    except OSError:
        return False


def apply(environ=os.environ, gpu: bool | None = None) -> dict[str, str]:
    """Sets every DEFAULTS variable (CPU settings) that `environ` lacks when no GPU
    is visible (`gpu`: None asks `gpu_visible(environ)`); returns the ones it set."""
    if gpu is None:
        gpu = gpu_visible(environ)
    applied = {}
    for name, value in ({} if gpu else DEFAULTS).items():
        if name not in environ:
            environ[name] = applied[name] = value
    return applied


def exit_now(code, environ=os.environ) -> None:
    """Ends the process with `code` (a SystemExit code: None, int or message) after
    flushing the standard streams and every logging handler, skipping the interpreter's
    teardown; in a multi-worker cluster (TF_CONFIG set) raises SystemExit instead."""
    if environ.get("TF_CONFIG"):
        raise SystemExit(code)
    if isinstance(code, str):
        print(code, file=sys.stderr)
    logging.shutdown()  # absl's handler included
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1 if isinstance(code, str) else code or 0)
