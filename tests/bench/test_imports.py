"""bench/ has no import circle: the side-by-side harness (bench/compare/) is imported by
the rest of bench/ one way at most, and nothing it imports comes back to it.

The graph is read from the source with `ast`, so imports inside functions count too.
`python tests/bench/test_imports.py` prints it (module -> the bench modules it imports).
"""

import ast
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(REPO, "bench")


def bench_modules() -> dict:
    """{dotted module name: its file} for every .py file under bench/ (packages as their
    __init__), outside hidden folders (setup_peers.sh's bench/compare/.venvs/ holds the
    peers' installed packages)."""
    root = os.path.dirname(BENCH)
    modules = {}
    for folder, folders, files in os.walk(BENCH):
        folders[:] = [f for f in folders if not f.startswith(".")]
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                modules[dotted.removesuffix(".__init__")] = path
    return modules


def imports_of(module: str, path: str, modules) -> set:
    """The bench modules `module` imports, at any depth of its code."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1 folders
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            # `from bench.compare import trainings` imports the module bench.compare.trainings.
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            # The module itself, or the deepest bench module it lies in.
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module and name != "bench":
                found.add(name)
    return found


def import_graph() -> dict:
    modules = bench_modules()
    return {m: sorted(imports_of(m, p, modules)) for m, p in sorted(modules.items())}


def cycles(graph) -> list:
    """Every import circle of `graph`, each as the path that closes it."""
    found, state = [], {}  # state: 1 on the current path, 2 done

    def visit(node, path):
        state[node] = 1
        for target in graph.get(node, ()):
            if state.get(target) == 1:
                found.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[node] = 2

    for node in graph:
        if node not in state:
            visit(node, [node])
    return found


def test_bench_has_no_import_circle():
    graph = import_graph()
    assert "bench.compare.run_protocol" in graph and graph["bench.compare.trainings"]
    assert cycles(graph) == []


def test_the_circle_finder_sees_function_level_imports(tmp_path):
    modules = {"bench.a": str(tmp_path / "a.py"), "bench.sub.b": str(tmp_path / "b.py")}
    (tmp_path / "a.py").write_text("def f():\n    from bench.sub import b\n")
    (tmp_path / "b.py").write_text("import os\nfrom .. import a\n")
    graph = {m: sorted(imports_of(m, p, modules)) for m, p in modules.items()}
    assert graph == {"bench.a": ["bench.sub.b"], "bench.sub.b": ["bench.a"]}
    assert cycles(graph) == [["bench.a", "bench.sub.b", "bench.a"]]


if __name__ == "__main__":
    for module, targets in import_graph().items():
        print(f"{module} -> {', '.join(targets) or '-'}")
