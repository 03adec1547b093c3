"""The translate and evaluate binaries, run in-process on the tiny model directory."""

import re

import numpy as np
import pytest
import tensorflow as tf
from absl import flags

from tf_transformer import evaluate, translate
from tf_transformer.config import DecodeConfig
from tf_transformer.decoding.translator import Translator
from tf_transformer.model import build_model
from tf_transformer.training import checkpoints

FLAGS = flags.FLAGS
LINES = [
    "Always checkbox",
    "If you want, you can override the default substitution font that your operating system "
    "uses when it encounters an unavailable font in a document.",
    "Fonts",
    "Enables the font replacement settings that you define.",
    "Replacement table",
]


def _run(main, *args):
    FLAGS.unparse_flags()
    FLAGS(["binary", *args])
    main([])


def _translate(tmp_path, model_dir, data: bytes, *args):
    source, output = tmp_path / "input.txt", tmp_path / "output.txt"
    source.write_bytes(data)
    _run(translate.main, f"--model_dir={model_dir}", f"--input={source}", f"--output={output}",
         "--extra_length=6", *args)
    return output.read_text(encoding="utf-8").split("\n")[:-1]


@pytest.mark.slow
def test_output_is_in_input_order(tmp_path, tiny_model_dir):
    lines = _translate(tmp_path, tiny_model_dir, "\n".join(LINES).encode() + b"\n",
                       "--batch_size=2", "--beam_size=2")
    translator = Translator.from_model_dir(
        tiny_model_dir, decode_config=DecodeConfig(beam_size=2, extra_length=6))
    alone = [translator.translate(tf.constant([line]))["translation"].numpy()[0].decode()
             for line in LINES]
    assert lines == alone
    assert len(set(lines)) == len(LINES)


def test_nbest_lines_are_index_score_translation(tmp_path, tiny_model_dir):
    lines = _translate(tmp_path, tiny_model_dir, "\n".join(LINES[:3]).encode(),  # no final \n
                       "--nbest=3", "--beam_size=3", "--batch_size=2")
    assert len(lines) == 9
    fields = [line.split("\t") for line in lines]
    assert all(len(f) == 3 for f in fields)
    assert [int(f[0]) for f in fields] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    scores = np.array([float(f[1]) for f in fields]).reshape(3, 3)
    assert (np.diff(scores, axis=1) <= 0).all()


def test_bad_lines_give_one_output_line_each(tmp_path, tiny_model_dir, caplog):
    data = b"\n".join([b"Fonts", b"", b"bad \xff\xfe bytes \xc3", " ".join(["word"] * 5000).encode(),
                       b"   ", b"Replacement table\r", b""])  # ends with an empty line
    lines = _translate(tmp_path, tiny_model_dir, data + b"\n", "--batch_size=3", "--beam_size=1")
    assert len(lines) == 7
    assert lines[1] == "" and lines[4] == "" and lines[6] == ""
    assert all(lines[i] for i in (0, 2, 3, 5))
    warnings = "\n".join(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert "(0-based: 2): invalid UTF-8" in warnings
    assert "(0-based: 1, 4, 6): empty" in warnings
    assert "(0-based: 3): over 63 tokens, truncated" in warnings


@pytest.mark.slow
def test_averaged_model_dir_and_attention_plot(tmp_path, tiny_model_dir):
    averaged = str(tmp_path / "averaged")
    checkpoints.write_averaged(tiny_model_dir, 1, averaged, build_model)
    plot = tmp_path / "attention.png"
    lines = _translate(tmp_path, averaged, "\n".join(LINES[2:4]).encode(), "--beam_size=2",
                       f"--plot_attention={plot}")
    original = _translate(tmp_path, tiny_model_dir, "\n".join(LINES[2:4]).encode(),
                          "--beam_size=2", f"--checkpoint={tf.train.latest_checkpoint(tiny_model_dir)}")
    assert lines == original  # the mean of one checkpoint is itself
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_evaluate_prints_the_figures(tmp_path, tiny_model_dir, capsys):
    data = tmp_path / "dev.tsv"
    data.write_text("".join(f"{line}\t{line}\n" for line in LINES), encoding="utf-8")
    _run(evaluate.main, f"--model_dir={tiny_model_dir}", f"--data={data}", "--beam_size=1",
         "--extra_length=4", "--batch_size=2")
    out = capsys.readouterr().out
    figures = dict(re.findall(r"(\w+)=(\S+)", out.splitlines()[0]))
    for key in ("bleu", "chrf", "tok_bleu", "sentences_per_sec", "tokens_per_sec"):
        assert 0.0 <= float(figures[key]) < float("inf"), key
    assert figures["sentences"] == "5"
    assert re.search(r"^bleu_signature=nrefs:1\|.*tok:13a", out, re.M)
    assert re.search(r"^chrf_signature=", out, re.M)
    assert "paper-style tokenized BLEU" in out


def test_evaluate_requires_data(tiny_model_dir):
    from absl import app
    with pytest.raises(app.UsageError):
        _run(evaluate.main, f"--model_dir={tiny_model_dir}")
