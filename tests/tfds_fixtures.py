"""Binaries run on TFDS mock data: the recipes' `tfds:wmt14_translate/...` specs read
examples that tensorflow_datasets.testing.mock_data generates from the dataset's
features (offline; each split holds `num_examples` random strings of ' a-j').

`run_mains_on_mock_data` runs a binary's main once per argument list in the test's own
process (binary_fixtures.run_mains: flags parsed anew for each run), inside mock_data;
`make test`'s recipe test runs its binaries so, each launch would import TensorFlow.

  python tests/tfds_fixtures.py NUM_EXAMPLES MODULE ARGS... [--- ARGS...]

runs MODULE's `main` once per argument list ("---" separates them), in a process of its
own: used by tests/test_recipes.py (`run_binary`) for the recipes at their paper sizes,
whose models are better released with their process.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def binary_env() -> dict:
    """The test process's environment for a binary: quiet, unbuffered, single-worker."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    env.pop("TF_CONFIG", None)
    return env


def run_binary(module: str, runs: list[list[str]], num_examples: int, env: dict,
               timeout: float) -> subprocess.CompletedProcess:
    """Runs `module`'s main for each argument list of `runs` in one process on mock data."""
    args = [sys.executable, os.path.abspath(__file__), str(num_examples), module]
    for i, run in enumerate(runs):
        args += (["---"] if i else []) + run
    return subprocess.run(args, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def run_mains_on_mock_data(module: str, runs: list[list[str]], num_examples: int
                           ) -> list[dict]:
    """binary_fixtures.run_main(module, argv) for each argv of `runs`, in this process on
    mock data: [{"code", "stdout", "stderr"}] in order."""
    import tensorflow_datasets as tfds
    from binary_fixtures import run_mains

    with tfds.testing.mock_data(num_examples=num_examples):
        return run_mains(module, runs, env=binary_env())


def _main(argv: list[str]) -> None:
    sys.path.insert(0, REPO_ROOT)
    num_examples, module_name, rest = int(argv[1]), argv[2], argv[3:]
    runs, current = [], []
    for arg in rest:
        if arg == "---":
            runs.append(current)
            current = []
        else:
            current.append(arg)
    runs.append(current)
    module = importlib.import_module(module_name)
    import tensorflow_datasets as tfds
    from absl import flags

    for args in runs:
        flags.FLAGS.unparse_flags()
        flags.FLAGS([module_name, *args])
        print(f"=== {module_name} {' '.join(args)}", flush=True)
        with tfds.testing.mock_data(num_examples=num_examples):
            module.main([module_name])
        sys.stdout.flush()


if __name__ == "__main__":
    _main(sys.argv)
