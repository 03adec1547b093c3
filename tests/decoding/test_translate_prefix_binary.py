"""`translate --target_prefix=FILE`: one prefix per input line, in input order through the
binary's sort and chunks; beam and sampling; lines that do not pair up are refused."""

import pytest
import tensorflow as tf
from binary_fixtures import run_main
from model_fixtures import SAMPLE_LINES

from tf_transformer.config import DecodeConfig
from tf_transformer.decoding.translator import Translator
from tf_transformer.model_dir import ModelDir

LINES = SAMPLE_LINES[:5]
PREFIXES = ["Die", "", "Wenn Sie", "", "Schrift"]
DECODE_FLAGS = ["--beam_size=2", "--extra_length=4", "--batch_size=2", "--parallel_searches=1"]


def _files(tmp_path, prefixes=PREFIXES):
    source, prefix = tmp_path / "in.txt", tmp_path / "prefix.txt"
    source.write_text("".join(line + "\n" for line in LINES), encoding="utf-8")
    prefix.write_text("".join(p + "\n" for p in prefixes), encoding="utf-8")
    return str(source), str(prefix)


def _translate(model_dir, *flags):
    return run_main("tf_transformer.translate", [f"--model_dir={model_dir}", *DECODE_FLAGS,
                                                 "--noprogress", *flags])


def test_each_line_continues_its_prefix_in_input_order(tiny_model_dir, tmp_path):
    source, prefix = _files(tmp_path)
    # chunks of 2 lines, sorted within a chunk: a prefix must follow its own line
    run = _translate(tiny_model_dir, f"--input={source}", f"--target_prefix={prefix}",
                     "--chunk_size=2")
    assert run["code"] == 0, run["stderr"][-2000:]
    outputs = run["stdout"].splitlines()
    decode = DecodeConfig(beam_size=2, extra_length=4, batch_size=2, parallel_searches=1)
    translator = Translator.from_model_dir(ModelDir(tiny_model_dir), decode_config=decode)
    expected = translator.translate_with_prefix(tf.constant(LINES), tf.constant(PREFIXES))
    assert outputs == [t.decode("utf-8") for t in expected["translation"].numpy()]
    assert all(out.startswith(p) for out, p in zip(outputs, PREFIXES))
    # An empty prefix is translate's output: test_target_prefix.py.


def test_sampling_continues_the_prefixes(tiny_model_dir, tmp_path):
    source, prefix = _files(tmp_path)
    run = _translate(tiny_model_dir, f"--input={source}", f"--target_prefix={prefix}",
                     "--sampling_topk=5", "--seed=3")
    assert run["code"] == 0, run["stderr"][-2000:]
    outputs = run["stdout"].splitlines()
    assert len(outputs) == len(LINES) and all(o.startswith(p) for o, p in zip(outputs, PREFIXES))


@pytest.mark.parametrize("prefixes, message", [
    (PREFIXES[:3], "end after 3 lines"), (PREFIXES + ["extra"], "more lines than the input")])
def test_prefix_lines_that_do_not_pair_up_are_refused(tiny_model_dir, tmp_path, prefixes, message):
    source, prefix = _files(tmp_path, prefixes)
    run = _translate(tiny_model_dir, f"--input={source}", f"--target_prefix={prefix}")
    assert run["code"] == 1 and message in run["stderr"], run["stderr"][-2000:]
    nbest = _translate(tiny_model_dir, f"--input={source}", f"--target_prefix={prefix}",
                       "--nbest=2")
    assert nbest["code"] == 1 and "--target_prefix gives the best output" in nbest["stderr"]
