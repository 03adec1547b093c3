"""Alignments as text (cli/alignments.py) and the translate binary's batch decoders
(cli/decoders.py): formats, sampling seeds, and streamed lines with alignments."""

import io
import random

import numpy as np
import tensorflow as tf
from model_fixtures import tiny_config

from tf_transformer.cli import alignments, decoders, streaming
from tf_transformer.config import DecodeConfig
from tf_transformer.decoding.translator import Translator
from tf_transformer.model.transformer import build_model


def test_hard_is_pharaoh_over_tokens_before_eos_and_soft_is_the_matrix():
    # 3 target rows (the last EOS's), 3 source tokens + EOS.
    matrix = np.array([[0.1, 0.6, 0.2, 0.1],
                       [0.1, 0.1, 0.2, 0.6],  # EOS column excluded from the argmax: 2
                       [0.0, 0.0, 0.1, 0.9]], np.float32)
    assert alignments.hard(matrix, target_tokens=2) == "1-0 2-1"
    assert alignments.hard(matrix, target_tokens=3) == "1-0 2-1 2-2"  # ran to max length
    assert alignments.soft(matrix, target_tokens=2) == (
        "0.1000,0.6000,0.2000,0.1000 0.1000,0.1000,0.2000,0.6000 0.0000,0.0000,0.1000,0.9000")
    empty = np.zeros([0, 0], np.float32)
    assert alignments.hard(empty, 0) == alignments.soft(empty, 0) == ""


def test_batch_seeds_differ_by_seed_and_text_and_repeat():
    texts = [b"a", b"b"]
    seeds = {decoders.batch_seed(s, t) for s in range(50) for t in (texts, [b"a"], [b"c"])}
    assert len(seeds) == 150 and all(0 <= s < 2 ** 63 for s in seeds)
    assert decoders.batch_seed(3, texts) == decoders.batch_seed(3, list(texts))


def test_streamed_lines_end_in_their_alignment(small_tokenizer):
    # A tiny model, seeded random weights, one layer each side (its two searches with
    # alignments trace every layer).
    random.seed(0)  # Keras draws initializer seeds from Python's and NumPy's generators
    np.random.seed(0)
    config = tiny_config(small_tokenizer.vocab_size, num_layers=1)
    translator = Translator(build_model(config.model), small_tokenizer,
                            DecodeConfig(beam_size=2, nbest=2, extra_length=3),
                            config.data.max_length)
    lines = ["Fonts", "", "Replacement table"]
    data = ("\n".join(lines) + "\n").encode()
    expected = translator.translate_nbest_with_alignments(tf.constant(lines))
    for nbest, form in ((False, "hard"), (True, "soft")):
        out = io.StringIO()
        streaming.translate_stream(
            translator, io.BytesIO(data), out, batch_size=2, chunk_size=2, nbest=nbest,
            decode_batch=decoders.with_alignments(translator, nbest, False),
            alignment_format=form)
        written = out.getvalue().split("\n")[:-1]
        assert len(written) == (6 if nbest else 3)
        for k, line in enumerate(written):
            i, n = (k // 2, k % 2) if nbest else (k, 0)
            text, alignment = line.split("\t")[-2:]
            assert text == expected["translations"].numpy()[i, n].decode()
            length = expected["lengths"].numpy()[i, n]
            columns = expected["source_lengths"].numpy()[i]
            matrix = expected["alignments"].numpy()[i, n, :length, :columns]
            tokens = expected["target_tokens"].numpy()[i, n]
            assert alignment == alignments.FORMATS[form](matrix, tokens)
            assert (alignment == "") == (lines[i] == "")
        if not nbest:  # one i-j pair per target token before EOS
            pairs = [len(line.split("\t")[1].split()) for line in written]
            assert pairs == list(expected["target_tokens"].numpy()[:, 0]) and pairs[0] > 0
