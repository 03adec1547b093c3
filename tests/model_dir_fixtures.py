"""Shared by the checkpoint and model-selection tests: weights compared with numpy; and
the AST reader that finds a path joined onto a model directory outside model_dir/."""

import ast

import numpy as np


def assert_weights(model, expected):
    """`model.weights` equal `expected` (float32 arrays in that order)."""
    assert len(model.weights) == len(expected)
    for var, value in zip(model.weights, expected):
        np.testing.assert_allclose(var.numpy(), value, rtol=1e-6, atol=1e-7, err_msg=var.path)


def mean_weights(arrays_by_step, steps):
    """The float64 mean over `steps` of each weight in {step: [arrays]}."""
    return [np.mean([arrays_by_step[s][i].astype(np.float64) for s in steps], axis=0)
            for i in range(len(arrays_by_step[steps[0]]))]


# -- the AST reader of tests/test_model_dir.py's layout test ----------------------------
# The contract's names (model_dir/layout.py): joining one onto any directory builds a
# model directory's path.
CONTRACT_CONSTANTS = {"CONFIG_FILE", "VOCAB_FILE", "SOURCE_VOCAB_FILE", "TARGET_VOCAB_FILE",
                      "BEST_DIR", "RECORD_FILE", "INIT_FROM_FILE", "INPUT_DIR"}
CONTRACT_NAMES = {"config.json", "vocab.model", "source_vocab.model", "target_vocab.model",
                  "best", "best.json", "init_from.json", "input", "train", "dev"}
JOINS = {"os.path.join", "posixpath.join", "tf.io.gfile.join", "pathlib.Path", "Path"}


UNWRAPPED = {"str", "os.fspath", "os.path.abspath", "os.path.expanduser", "os.path.realpath",
             "pathlib.Path", "Path"}


def names_model_dir(node: ast.AST) -> bool:
    """An expression whose value is a model directory's path: a name, attribute or key
    called *model_dir (`model_dir`, `self.model_dir`, `FLAGS.model_dir`, `r["model_dir"]`,
    not `saved_model_dir`), maybe through str() or os.path.abspath()."""
    while isinstance(node, ast.Call) and ast.unparse(node.func) in UNWRAPPED and node.args:
        node = node.args[0]
    if isinstance(node, ast.Subscript):
        node = node.slice
    name = (node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute)
            else node.value if isinstance(node, ast.Constant) and isinstance(node.value, str)
            else "")
    name = name.lower()
    return name.endswith("model_dir") and not name.endswith("saved_model_dir")


def _names_contract_file(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id in CONTRACT_CONSTANTS:
            return True
        if isinstance(sub, ast.Attribute) and sub.attr in CONTRACT_CONSTANTS:
            return True
        if isinstance(sub, ast.Constant) and sub.value in CONTRACT_NAMES:
            return True
    return False


def _is_text(node: ast.AST) -> bool:
    return isinstance(node, ast.JoinedStr) or (
        isinstance(node, ast.Constant) and isinstance(node.value, str))


def path_joins_onto_model_dirs(source: str) -> list[str]:
    """The expressions of `source` that build a path inside a model directory:
    os.path.join (or tf.io.gfile.join, pathlib) onto something named *model_dir* or
    with one of the contract's file names; `+` or `/` of such a name and text; an
    f-string with such a name followed by a "/"."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in JOINS and node.args:
            if names_model_dir(node.args[0]) or any(map(_names_contract_file, node.args[1:])):
                found.append(ast.unparse(node))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Div)):
            sides = (node.left, node.right)
            if any(map(names_model_dir, sides)) and (
                    isinstance(node.op, ast.Div) or any(map(_is_text, sides))):
                found.append(ast.unparse(node))
        elif isinstance(node, ast.JoinedStr):
            parts = node.values
            for value, after in zip(parts, parts[1:]):
                if (isinstance(value, ast.FormattedValue) and names_model_dir(value.value)
                        and isinstance(after, ast.Constant) and str(after.value)[:1] in "/\\"):
                    found.append(ast.unparse(node))
    return found
