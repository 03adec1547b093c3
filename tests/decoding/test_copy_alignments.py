"""Alignments of a model that learned to copy, through the translate binary: copied tokens
align to their own source positions (hard alignment i-i). (That asking for alignments
changes no output is test_translator_alignments.py's.)

The model (1+1 layers, d_model 32) trains 300 steps on copy pairs (source == target)
of short lines of the embedded corpus, with the fixtures' Trainer; its one decoder
layer's cross-attention does the copying, so it looks at the token it copies.
"""

import pytest
from binary_fixtures import run_main
from model_fixtures import TRAIN_TSV, make_model_dir

from tf_transformer.inputs import corpus

DECODE_FLAGS = ["--beam_size=2", "--extra_length=5", "--batch_size=8"]


@pytest.fixture(scope="module")
def copy_model(tmp_path_factory, spm_model_path):
    lines = corpus.read_tsv(TRAIN_TSV, max_chars=40).sources
    with open(spm_model_path, "rb") as f:
        proto = f.read()
    path = str(tmp_path_factory.mktemp("copy") / "model")
    make_model_dir(path, proto, steps=300, seed=1, pairs=corpus.Corpus(lines[:4000], lines[:4000]),
                   num_layers=1)
    return path, lines[5000:5030]


@pytest.mark.slow
def test_copied_tokens_align_to_their_source_positions(copy_model, tmp_path):
    model_dir, lines = copy_model
    source = tmp_path / "in.txt"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    run = run_main("tf_transformer.translate", [f"--model_dir={model_dir}", f"--input={source}",
                                                 "--with_alignments=hard", *DECODE_FLAGS])
    assert run["code"] == 0, run["stderr"][-3000:]
    written = [line.split("\t") for line in run["stdout"].split("\n")[:-1]]
    assert len(written) == len(lines)
    copied = diagonal = 0
    for line, (text, alignment) in zip(lines, written):
        if text != line:
            continue
        pairs = [tuple(map(int, pair.split("-"))) for pair in alignment.split()]
        assert [j for _, j in pairs] == list(range(len(pairs)))  # one pair per target token
        copied += 1
        diagonal += sum(i == j for i, j in pairs) / len(pairs)
    assert copied >= 8, written  # the model copies
    assert diagonal / copied >= 0.9
