"""The settings a binary gives its process before TensorFlow is imported.

The library sets nothing at import: a program that imports tf_transformer keeps
its own environment. Each binary (train, translate, evaluate, average_checkpoints,
export) calls `apply()` first in its main, before its first TensorFlow import,
because TensorFlow reads these variables once, at import.

  TF_ENABLE_ONEDNN_OPTS=1  TensorFlow's oneDNN kernels. The stock wheel turns
      them on by itself only on CPUs with AVX-512 VNNI/BF16 or AMX; on an
      AVX2/FMA CPU its Eigen kernels are built without FMA and oneDNN doubles
      the products' throughput (BUILD.md, performance decisions). They only
      concern ops TensorFlow places on the CPU.

A variable the user set is left as it is.
"""

from __future__ import annotations

import os

DEFAULTS = {"TF_ENABLE_ONEDNN_OPTS": "1"}


def apply(environ=os.environ) -> dict[str, str]:
    """Sets every DEFAULTS variable that `environ` lacks; returns the ones it set."""
    applied = {}
    for name, value in DEFAULTS.items():
        if name not in environ:
            environ[name] = applied[name] = value
    return applied
