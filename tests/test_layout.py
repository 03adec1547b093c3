"""The package's layout rules, read from its source: imports run one way (no circle,
function-level imports included), decoding/ and exporters/ never import training/, and
nothing in tf_transformer/ keeps hidden process state (no `global` statement, no
environment variable set at import time; binaries set their process defaults in main,
before TensorFlow is imported), and every tf.function is traced without autograph."""

from __future__ import annotations

import ast
import glob
import os
import re
import subprocess
import sys

import pytest
from binary_fixtures import binaries
from model_fixtures import REPO_ROOT

from tf_transformer import process_defaults

PACKAGE = os.path.join(REPO_ROOT, "tf_transformer")
# The console commands (pyproject.toml); `binaries()` finds every binary, these and the others.
BINARIES = ["tf_transformer.train", "tf_transformer.translate", "tf_transformer.evaluate",
            "tf_transformer.average_checkpoints", "tf_transformer.score", "export.__main__"]


def _modules() -> dict[str, str]:
    """Module name -> path, for every module of tf_transformer/ (a package as its __init__)."""
    paths = glob.glob(os.path.join(PACKAGE, "**", "*.py"), recursive=True)
    return {os.path.relpath(path, REPO_ROOT)[:-3].replace(os.sep, ".").removesuffix(".__init__"):
            path for path in paths}


def import_graph() -> dict[str, set[str]]:
    """Module -> the tf_transformer modules it imports anywhere in its source.

    `from package import name` names the submodule when `name` is one, else the
    package; the top package (`tf_transformer`, empty) is left out."""
    modules = _modules()
    graph = {}
    for module, path in modules.items():
        imported = set()
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                subs = {f"{node.module}.{a.name}" for a in node.names} & modules.keys()
                imported |= subs or {node.module}
        graph[module] = {m for m in imported & modules.keys() if m not in (module, "tf_transformer")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_in_the_package():
    graph = import_graph()
    assert "tf_transformer.decoding.translator" in graph  # the graph was read
    assert cycles(graph) == []


# The module that wraps a library's private API, each fact behind a guard test: Keras's
# (tests/training/test_keras_optimizers.py).
PRIVATE_API_ADAPTERS = {"tf_transformer.training.keras_optimizers"}
# Underscore names that are public API: NamedTuple's methods, and a documented os function.
PUBLIC_UNDERSCORE_CALLS = {"_replace", "_asdict", "_make", "os._exit"}


def _other_objects_private_calls(tree: ast.Module) -> list[str]:
    """The `x._name(...)` calls where x is not self, cls or super(): another object's
    underscore method."""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        name, owner = node.func.attr, ast.unparse(node.func.value)
        if (not name.startswith("_") or (name.startswith("__") and name.endswith("__"))
                or owner in ("self", "cls", "super()")
                or {name, f"{owner}.{name}"} & PUBLIC_UNDERSCORE_CALLS):
            continue
        found.append(ast.unparse(node.func))
    return found


def test_no_module_calls_another_objects_private_method():
    """A collaborator is called through its public methods (the trainer's step is step.py's
    TrainStep for the compiled step and the host loop); only the private-API adapters reach in."""
    for module, path in _modules().items():
        if module not in PRIVATE_API_ADAPTERS:
            tree = ast.parse(open(path, encoding="utf-8").read())
            assert not _other_objects_private_calls(tree), module
    found = _other_objects_private_calls(ast.parse(
        "trainer._run_step(x)\nself._a()\ncls._b()\nsuper()._c()\nstate._replace(a=1)\n"
        "x.__enter__()\nself.step._grads(b)\nos._exit(0)\n"))
    assert found == ["trainer._run_step", "self.step._grads"]


@pytest.mark.parametrize("package", ["tf_transformer.decoding", "tf_transformer.exporters",
                                     "tf_transformer.search", "tf_transformer.model"])
def test_serving_side_never_imports_training(package):
    graph = import_graph()
    offenders = {m: sorted(d for d in deps if d.startswith("tf_transformer.training"))
                 for m, deps in graph.items() if m.startswith(package)}
    assert not {m: d for m, d in offenders.items() if d}


def _module_level_statements(tree: ast.Module):
    """Statements that run at import: the module body and its if/try/with blocks,
    not function or class bodies' functions."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        yield node
        for field in ("body", "orelse", "finalbody", "handlers"):
            todo.extend(getattr(node, field, []) or [])


def _sets_environment(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, (ast.Assign, ast.AugAssign)):
            targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
            if any("environ" in ast.unparse(t) for t in targets):
                return True
        if isinstance(sub, ast.Call):
            called = ast.unparse(sub.func)
            if called in ("os.putenv", "os.environ.setdefault", "os.environ.update"):
                return True
    return False


def test_no_global_statement_and_no_environment_set_at_import():
    for module, path in _modules().items():
        tree = ast.parse(open(path, encoding="utf-8").read())
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.Global)], module
        assert not [n for n in _module_level_statements(tree) if _sets_environment(n)], module


def _functions_with_autograph(tree: ast.Module) -> list[str]:
    """The `tf.function` decorators and calls that leave autograph on (its default)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "tf.function":
            if not any(k.arg == "autograph" and ast.unparse(k.value) == "False"
                       for k in node.keywords):
                found.append(ast.unparse(node))
        decorators = getattr(node, "decorator_list", [])
        found += [ast.unparse(d) for d in decorators if ast.unparse(d) == "tf.function"]
    return found


def test_every_tf_function_is_traced_without_autograph():
    """Control flow in the package is explicit (tf.while_loop, tf.cond): autograph's
    rewriting of every called function's source was a third of a training run's start."""
    for module, path in _modules().items():
        tree = ast.parse(open(path, encoding="utf-8").read())
        assert not _functions_with_autograph(tree), module
    offenders = _functions_with_autograph(ast.parse(
        "@tf.function\ndef f(): pass\n@tf.function(jit_compile=True)\ndef g(): pass\n"
        "h = tf.function(f)\nk = tf.function(f, autograph=False)\n"))
    assert offenders == ["tf.function", "tf.function(jit_compile=True)", "tf.function(f)"]


def test_the_environment_checks_see_what_they_look_for():
    tree = ast.parse("import os\nos.environ.setdefault('A', '1')\ndef f():\n    global X\n")
    assert any(_sets_environment(n) for n in _module_level_statements(tree))
    assert [n for n in ast.walk(tree) if isinstance(n, ast.Global)]
    inside = ast.parse("import os\ndef f():\n    os.environ['A'] = '1'\n")
    assert not any(_sets_environment(n) for n in _module_level_statements(inside))


def test_importing_the_package_leaves_the_environment_alone():
    """Every library module of tf_transformer/ imported in a clean process (the
    binaries define flags, so each runs alone): os.environ unchanged, beyond what the
    libraries under it set themselves (joblib, under sacremoses, sets KMP_INIT_AT_FORK)."""
    modules = sorted(m for m in _modules() if m not in BINARIES + ["tf_transformer.summary"])
    code = ("import os, importlib, json, sys\n"
            "import tensorflow, tensorflow_text, keras, keras_hub, sacrebleu, sacremoses, matplotlib\n"
            "before = dict(os.environ)\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "print(json.dumps(sorted(set(os.environ.items()) ^ set(before.items()))))\n")
    env = {k: v for k, v in os.environ.items() if k not in process_defaults.DEFAULTS}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, check=True,
                         capture_output=True, text=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_binaries_import_tensorflow_only_after_their_process_defaults():
    """Every binary found (binary_fixtures.binaries: the console commands and the others)
    imports no TensorFlow at import, so the `process_defaults.apply()` that starts its main
    runs before TensorFlow reads the environment."""
    found = binaries()
    assert set(BINARIES) <= {m + ".__main__" if p.endswith("__main__.py") else m
                             for m, p in found.items()}
    for module, path in found.items():
        name = module + ".__main__" if path.endswith("__main__.py") else module
        code = f"import importlib, sys\nimportlib.import_module({name!r})\n" \
               "print('tensorflow' in sys.modules)\n"
        out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True,
                             capture_output=True, text=True).stdout
        assert out.strip() == "False", module
        main = next(n for n in ast.parse(open(path, encoding="utf-8").read()).body
                    if isinstance(n, ast.FunctionDef) and n.name == "main")
        body = main.body[1:] if ast.get_docstring(main) else main.body
        calls = [ast.unparse(n) for n in body[:2]]
        assert "process_defaults.apply()" in calls, (module, calls)


def test_process_defaults_fill_only_what_the_user_left_unset():
    environ = {"TF_ENABLE_ONEDNN_OPTS": "0"}
    assert process_defaults.apply(environ) == {}
    assert environ == {"TF_ENABLE_ONEDNN_OPTS": "0"}
    empty = {}
    assert process_defaults.apply(empty) == {"TF_ENABLE_ONEDNN_OPTS": "1"} == empty


def test_a_finished_binary_exits_without_teardown_but_a_cluster_worker_does_not():
    """exit_now flushes the streams and logs and skips the interpreter's teardown (an
    atexit handler, which teardown would run, stays silent); every binary's `python -m`
    ends through it; with TF_CONFIG set the exit is the normal SystemExit."""
    code = ("import atexit, sys\n"
            "from absl import logging\n"
            "from tf_transformer import process_defaults\n"
            "atexit.register(lambda: print('teardown'))\n"
            "print('out', end='')\n"
            "logging.warning('logged')\n"
            "process_defaults.exit_now(sys.argv[1] if sys.argv[1] != '3' else 3)\n")
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    for argument, status, err in (("3", 3, "logged"), ("a message", 1, "a message")):
        run = subprocess.run([sys.executable, "-c", code, argument], cwd=REPO_ROOT, env=env,
                             capture_output=True, text=True)
        assert (run.returncode, run.stdout) == (status, "out") and err in run.stderr
    with pytest.raises(SystemExit) as raised:
        process_defaults.exit_now(4, environ={"TF_CONFIG": "{}"})
    assert raised.value.code == 4
    for module in BINARIES:
        path = os.path.join(REPO_ROOT, *module.split(".")) + ".py"
        source = open(path, encoding="utf-8").read()
        assert source.endswith('if __name__ == "__main__":\n    run()\n'), module
        assert "flags_lib.run_binary(main, __name__)" in source, module


def _absl_flags_imports(tree: ast.Module) -> list[str]:
    """The imports of absl's flags outside an `if __name__ == "__main__":` block."""
    body = [n for n in tree.body if not (isinstance(n, ast.If) and "__name__" in ast.unparse(n.test))]
    return [ast.unparse(n) for statement in body for n in ast.walk(statement)
            if (isinstance(n, ast.ImportFrom) and n.module == "absl"
                and any(a.name == "flags" for a in n.names))
            or (isinstance(n, ast.Import) and any(a.name == "absl.flags" for a in n.names))]


def test_library_modules_never_read_absl_flags():
    """flags.py reads the flags for the binaries; a library module takes values as arguments
    (a binary's own `__main__` block, as presets.py's, may read its flag and pass it in)."""
    readers = set(BINARIES) | {"tf_transformer.flags", "tf_transformer.summary"}
    for module, path in _modules().items():
        if module not in readers:
            assert not _absl_flags_imports(ast.parse(open(path, encoding="utf-8").read())), module
    found = _absl_flags_imports(ast.parse(
        "def main():\n    from absl import flags\nimport absl.flags\n"
        "if __name__ == '__main__':\n    from absl import app, flags\n"))
    assert found == ["from absl import flags", "import absl.flags"]


_REPO_PATH = re.compile(r"(?<![\w/.])((?:tf_transformer|tests|export|bench|data)/[\w/.-]*"
                        r"\.(?:py|md|txt|json|flags))")


def test_paths_named_in_the_code_exist():
    """A file path a docstring, comment or requirement names (tf_transformer/..., tests/...,
    export/..., bench/..., data/...) points at a file of the repository."""
    files = [os.path.join(REPO_ROOT, name) for name in ("requirements.txt", "requirements-test.txt")]
    for top in ("tf_transformer", "export", "tests"):
        files += [os.path.join(directory, name)
                  for directory, _, names in os.walk(os.path.join(REPO_ROOT, top))
                  for name in names if name.endswith((".py", ".txt", ".md"))]
    stale = [f"{os.path.relpath(path, REPO_ROOT)}: {named}" for path in files
             for named in _REPO_PATH.findall(open(path, encoding="utf-8").read())
             if not os.path.exists(os.path.join(REPO_ROOT, named))]
    assert not stale
    named = "see tests" + "/gone.py and a/tests/x.py"  # split: this file names no stale path
    assert _REPO_PATH.findall(named) == ["tests" + "/gone.py"]
