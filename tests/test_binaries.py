"""Every binary's --help lists each flag the project defines for it, with a default.

The binaries are found by their `app.run(` under a main guard and the expected flags are read
from absl's registry (`--helpxml` of the same binary), so a new binary or flag
is checked without editing this file. Also: binaries never import each other, and every
`python -m` command of README.md names one (or a bench/ script).
"""

import ast
import functools
import json
import os
import re
import subprocess
import sys

import pytest
from binary_fixtures import binaries, help_blocks, project_flags
from model_fixtures import REPO_ROOT


BINARIES = binaries()


# `python -m MODULE --help` (runpy, as -m runs it), then the XML that --helpxml prints, from
# the same flag registry: one process per binary, so one that imports TensorFlow pays it once.
# A binary's end (process_defaults.exit_now) is a SystemExit here, so the XML can follow.
_HELP_AND_XML = """
import contextlib, io, json, runpy, sys
from absl import flags
from tf_transformer import process_defaults
process_defaults.exit_now = sys.exit
sys.argv = [sys.argv[1], "--help"]
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    except SystemExit:
        pass
xml = io.StringIO()
flags.FLAGS.write_help_in_xml_format(xml)
print(json.dumps([xml.getvalue(), out.getvalue()]))
"""


def _run(module):
    """(--helpxml output, --help output) of `python -m module`."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    run = subprocess.run([sys.executable, "-c", _HELP_AND_XML, module], cwd=REPO_ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.splitlines()[-1])


def test_every_python_m_command_of_the_readme_runs_a_module_of_the_checkout():
    """The binaries' --help is tested below; bench/ scripts have a main guard."""
    with open(os.path.join(REPO_ROOT, "README.md"), encoding="utf-8") as f:
        modules = set(re.findall(r"python\s+-m\s+([A-Za-z_][\w.]*)", f.read()))
    assert {"tf_transformer.train", "export", "data.vocab", "bench.decode"} <= modules
    for module in sorted(modules - set(BINARIES) - {"pip", "venv"}):
        path = os.path.join(REPO_ROOT, *module.split(".")) + ".py"
        assert module.startswith("bench.") and os.path.exists(path), module
        assert 'if __name__ == "__main__":' in open(path, encoding="utf-8").read(), module


def test_the_documented_binaries_are_found():
    assert {"tf_transformer.train", "tf_transformer.translate", "tf_transformer.evaluate",
            "tf_transformer.average_checkpoints", "tf_transformer.summary",
            "tf_transformer.presets", "tf_transformer.score", "export", "data.vocab",
            "data.corpus_stats"} <= set(BINARIES)


@functools.lru_cache(maxsize=None)
def _help(module: str) -> tuple[dict[str, str], dict[str, str], str]:
    """(expected flags: name -> help, --help blocks: name -> text, --help output)."""
    helpxml, help_text = _run(module)
    expected = project_flags(helpxml)
    assert expected, helpxml[-2000:]
    return expected, help_blocks(help_text), help_text


@pytest.mark.parametrize("module", sorted(BINARIES))
def test_help_lists_every_flag(module):
    expected, blocks, help_text = _help(module)
    assert sorted(expected) == sorted(set(expected) & set(blocks)), help_text


@pytest.mark.parametrize("module", sorted(BINARIES))
def test_help_states_every_default(module):
    """absl prints "(default: ...)" unless the default is None: then the text must say."""
    expected, blocks, _ = _help(module)
    unstated = {name: blocks.get(name) for name in expected
                if not re.search(r"\(default: |\b(default|required)\b", blocks.get(name, ""),
                                 re.I)}
    assert not unstated


def _imported_modules(path: str) -> set[str]:
    tree = ast.parse(open(path, encoding="utf-8").read())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _defines_flags_on_import(path: str) -> bool:
    """Whether importing the module defines flags (presets.py defines its own under __main__)."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    top_level = [node for node in tree.body if not (
        isinstance(node, ast.If) and "__name__" in ast.unparse(node.test))]
    return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
               and node.func.attr.lower().startswith("define")
               for statement in top_level for node in ast.walk(statement))


@pytest.mark.parametrize("module", sorted(BINARIES))
def test_binaries_never_import_each_other(module):
    """An imported binary would bring flags this one never uses."""
    binaries = {m for m, path in BINARIES.items() if _defines_flags_on_import(path)}
    assert "tf_transformer.translate" in binaries and "tf_transformer.presets" not in binaries
    assert not _imported_modules(BINARIES[module]) & (binaries - {module})
