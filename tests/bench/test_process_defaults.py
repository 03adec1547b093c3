"""The benches measure the kernels the binaries run: each sets the binaries' process
defaults (process_defaults.apply, e.g. oneDNN on a CPU) before TensorFlow's import, which
therefore happens in main, never when a bench module is imported. Read with `ast`."""

import ast
import os

from test_imports import BENCH, bench_modules

# tf_transformer modules that import no TensorFlow: a bench may import them at its top.
TENSORFLOW_FREE = {"tf_transformer", "tf_transformer.config", "tf_transformer.presets",
                   "tf_transformer.process_defaults"}
# Where each bench that runs TensorFlow for a figure applies the defaults. decode_peer.py
# and ab_exports.py load exports as a server does (and run in the peers' venvs), and
# serving_soak.py as an app does, in the environment they are given.
APPLIED_IN = {"train_throughput.py": "main", "decode.py": "main",
              "compare/trainings.py": "matmul_peak_process"}


def _imported(node) -> list:
    """The modules an import statement loads (`from package import module` names the module)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and not node.level:
        if node.module == "tf_transformer":
            return [f"{node.module}.{alias.name}" for alias in node.names]
        return [node.module]
    return []


def _tensorflow_imports(nodes) -> list:
    """The imports among `nodes` that load TensorFlow: tensorflow itself, or a tf_transformer
    module outside TENSORFLOW_FREE."""
    return [name for node in nodes for name in _imported(node)
            if name.split(".")[0] == "tensorflow"
            or (name.split(".")[0] == "tf_transformer" and name not in TENSORFLOW_FREE)]


def tensorflow_at_import(path: str) -> list:
    """The TensorFlow imports a module runs at its top level."""
    with open(path, encoding="utf-8") as f:
        return _tensorflow_imports(ast.parse(f.read(), path).body)


def applied_before_tensorflow(path: str, function: str) -> bool:
    """Whether `function` in `path` calls process_defaults.apply before its first import of
    TensorFlow (an import it makes itself, at any depth of its body)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    body = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function)
    applies = [n.lineno for n in ast.walk(body) if isinstance(n, ast.Call)
               and ast.unparse(n.func) == "process_defaults.apply"]
    imports = [n.lineno for n in ast.walk(body) if _tensorflow_imports([n])]
    return bool(applies) and min(applies) < min(imports, default=float("inf"))


def test_no_bench_module_imports_tensorflow_when_imported(tmp_path):
    found = {module: names for module, path in bench_modules().items()
             if (names := tensorflow_at_import(path))}
    assert found == {}
    late = tmp_path / "late.py"
    late.write_text("import os\nimport tensorflow as tf\nfrom tf_transformer.config import EOS_ID\n"
                    "from tf_transformer import model_dir, presets\n"
                    "from tf_transformer.model import build_model\n")
    assert tensorflow_at_import(str(late)) == ["tensorflow", "tf_transformer.model_dir",
                                               "tf_transformer.model"]


def test_benches_apply_the_binaries_process_defaults_before_tensorflow(tmp_path):
    for name, function in APPLIED_IN.items():
        assert applied_before_tensorflow(os.path.join(BENCH, name), function), name
    late = tmp_path / "late.py"
    late.write_text("def main():\n    import tensorflow as tf\n    process_defaults.apply()\n")
    assert not applied_before_tensorflow(str(late), "main")
