"""Shared by the binary tests (test_binaries.py, test_packaging.py): the flags a binary's
--helpxml says this repository defines, and the flag blocks of its --help; `run_mains`
runs a binary several times in one process."""

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ElementTree

from model_fixtures import REPO_ROOT

PACKAGES = ("tf_transformer", "export", "data")  # where binaries live


def project_flags(helpxml: str) -> dict[str, str]:
    """name -> help text of the flags defined by this repository's modules."""
    flags = {}
    for flag in ElementTree.fromstring(helpxml).iter("flag"):
        where = flag.findtext("file")
        if where.startswith(REPO_ROOT) or where.split(".")[0] in PACKAGES:
            flags[flag.findtext("name")] = flag.findtext("meaning")
    return flags


def help_blocks(help_text: str) -> dict[str, str]:
    """--help's flags: "  --name: help" or "  --[no]name: help", then indented lines."""
    return dict(re.findall(r"^  --(?:\[no\])?(\w+): (.*(?:\n    .*)*)", help_text, re.M))


# `python -m MODULE ARGV...` for each ARGV: the module's main under absl's app.run, which
# reparses the flags on each run; stdout and stderr of each run are captured.
_RUN_MAINS = """
import contextlib, importlib, io, json, sys
from absl import app, flags
binary = importlib.import_module(sys.argv[1])
runs = []
for argv in json.loads(sys.argv[2]):
    flags.FLAGS.unparse_flags()
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            app.run(binary.main, argv=[sys.argv[1], *argv])
        except SystemExit as exit:
            code = 0 if exit.code is None else exit.code
    runs.append({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()})
print(json.dumps(runs))
"""


def run_mains(module: str, argvs: list[list[str]], env: dict | None = None,
              timeout: float = 600) -> list[dict]:
    """Runs the binary `module` (e.g. tf_transformer.translate) once per argv in one
    subprocess, as `python -m` runs it (absl's app.run of its main): TensorFlow is imported
    once, not once per run. Returns {"code" (the exit code), "stdout", "stderr"} per run."""
    result = subprocess.run([sys.executable, "-c", _RUN_MAINS, module, json.dumps(argvs)],
                            cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])
