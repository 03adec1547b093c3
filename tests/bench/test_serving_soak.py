"""bench/serving_soak.py's traffic and its process: batches of 1-32 lines of 1-60 words, a
hostile line now and then, from a seed; the soak imports no tf_transformer module."""

import ast
import random

from test_imports import BENCH

from bench import serving_soak


def test_the_traffic_varies_within_its_bounds_and_repeats_from_its_seed():
    words = ["alpha", "beta", "gamma"]
    batches = list(serving_soak.requests(random.Random(3), words, 400))
    sizes = [len(b) for b in batches]
    assert min(sizes) == 1 and max(sizes) == 32
    lines = [line for b in batches for line in b]
    hostile = sum(line in serving_soak.HOSTILE for line in lines)
    assert 0.01 < hostile / len(lines) < 0.03
    lengths = [len(line.split()) for line in lines if line not in serving_soak.HOSTILE]
    assert min(lengths) == 1 and max(lengths) == 60
    assert batches == list(serving_soak.requests(random.Random(3), words, 400))


def test_the_soak_imports_tensorflow_and_tensorflow_text_only():
    with open(f"{BENCH}/serving_soak.py", encoding="utf-8") as f:
        tree = ast.parse(f.read())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module.split(".")[0])
    assert "tf_transformer" not in imported
    assert {"tensorflow", "tensorflow_text"} <= imported
