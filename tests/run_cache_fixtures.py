"""Session fixtures built once per test run, not once per xdist worker.

`make test` runs the suite in several worker processes, each with its own session: a
session fixture that writes files (a SentencePiece model, a model directory, an export)
would be built by every worker that uses it. `built_once` builds such a file or directory
in a cache shared by the run's workers (beside their own temporary directories, under
pytest's base temporary directory of the run), under a file lock: the first worker to ask
builds it, the others wait and read it. A run without workers keeps it in its own base
temporary directory. Nothing is shared between runs.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable

import pytest
from filelock import FileLock


def run_cache_dir(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> str:
    """The directory shared by the run's workers (xdist's `worker_id` fixture: "master"
    without workers): the parent of each worker's base temporary directory."""
    base = tmp_path_factory.getbasetemp()
    root = base if worker_id == "master" else base.parent
    path = root / "run_cache"
    path.mkdir(exist_ok=True)
    return str(path)


def built_once(tmp_path_factory: pytest.TempPathFactory, worker_id: str, key: str,
               build: Callable[[str], object]) -> str:
    """The path `key` in the run's cache, built by `build(path)` (which creates `path`, a
    file or a directory) the first time a worker asks for it. `key` names what is built and
    how (e.g. "spm-bpe500-2000pairs.model"): two fixtures never share a key.

    A build that raised leaves no trace: the next worker to ask builds it again."""
    path = os.path.join(run_cache_dir(tmp_path_factory, worker_id), key)
    built = path + ".built"  # written last: the path is complete
    with FileLock(path + ".lock"):
        if not os.path.exists(built):
            if os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.exists(path):
                os.remove(path)
            build(path)
            open(built, "w").close()
    return path
