"""Fine-tuning (tf_transformer/training/fine_tuning.py, `train --init_from`): the embedding remapped by
piece, the refusals, and a model fine-tuned on a second corpus against one trained on it from
scratch.

The two corpora come from the embedded one: the second is every short pair whose source
names a spreadsheet or table word (cell, column, formula, ...), the first all other short
pairs; each has its own vocabulary.
"""

import dataclasses
import os
import re

import numpy as np
import pytest
import tensorflow as tf
from binary_fixtures import run_mains
from model_fixtures import EMBEDDED_CORPUS_DIR

from tf_transformer import model_dir as model_dir_lib
from tf_transformer.inputs import corpus, tokenizer
from tf_transformer.model import build_model
from tf_transformer.model_dir import ModelDir
from tf_transformer.training import fine_tuning

SPECIAL = [b"<pad>", b"<unk>", b"<s>", b"</s>"]


def test_piece_map_follows_pieces_and_keeps_the_special_ids():
    old = SPECIAL + [b"a", b"b", b"c"]
    new = SPECIAL + [b"c", b"x", b"a", b"y"]
    mapping = fine_tuning.piece_map(old, new)
    assert mapping.tolist() == [0, 1, 2, 3, 6, -1, 4, -1]
    old_table = np.arange(14, dtype=np.float32).reshape(7, 2)
    fresh = -np.arange(16, dtype=np.float32).reshape(8, 2) - 1
    rows = fine_tuning.remap_rows(old_table, fresh, mapping)
    np.testing.assert_array_equal(rows[[0, 1, 2, 3, 4, 6]], old_table[[0, 1, 2, 3, 6, 4]])
    np.testing.assert_array_equal(rows[[5, 7]], fresh[[5, 7]])
    # Specials keep their rows whatever their pieces are called.
    assert fine_tuning.piece_map([b"p", b"u", b"s", b"e", b"a"],
                                 SPECIAL + [b"a"]).tolist() == [0, 1, 2, 3, 4]


def test_source_checkpoint_is_the_latest_a_name_or_a_path(tiny_model_dir):
    latest = tf.train.latest_checkpoint(tiny_model_dir)
    source = ModelDir(tiny_model_dir)
    assert fine_tuning.source_checkpoint(source) == latest
    assert fine_tuning.source_checkpoint(source, os.path.basename(latest)) == latest
    assert fine_tuning.source_checkpoint(source, latest) == latest
    for missing in ("best", "ckpt-12345"):  # the fixture keeps no best/
        with pytest.raises(FileNotFoundError):
            fine_tuning.source_checkpoint(source, missing)


def test_a_new_vocabulary_keeps_the_rows_of_shared_pieces_exactly(
        tiny_model_dir, embedded_corpus):
    """On two replicas: every piece both vocabularies hold has its source row bit for bit
    (by piece, though most ids moved), new pieces the new model's own initial rows, the
    special ids their rows, and every other weight is the source's."""
    pairs = corpus.Corpus(embedded_corpus.sources[10000:12000],
                          embedded_corpus.targets[10000:12000])
    new_proto = tokenizer.train_sentencepiece(pairs, 400)
    source = model_dir_lib.load_model(ModelDir(tiny_model_dir))
    with open(os.path.join(tiny_model_dir, model_dir_lib.VOCAB_FILE), "rb") as f:
        old_pieces = fine_tuning.pieces(f.read())
    new_pieces = fine_tuning.pieces(new_proto)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = build_model(dataclasses.replace(source.config.model, vocab_size=400))
        fresh = model.weights[0].numpy()
        record = fine_tuning.initialize(model, ModelDir(tiny_model_dir), None, new_proto)

    old_ids = {piece: i for i, piece in enumerate(old_pieces)}
    shared = [i for i, piece in enumerate(new_pieces[4:], 4) if piece in old_ids]
    new = [i for i, piece in enumerate(new_pieces[4:], 4) if piece not in old_ids]
    moved = [i for i in shared if old_ids[new_pieces[i]] != i]
    assert len(shared) > 50 and len(new) > 50 and len(moved) > len(shared) // 2
    assert record["vocabulary"] == "updated"
    assert (record["pieces_kept"], record["pieces_new"], record["pieces_dropped"]) == (
        len(shared), len(new), len(old_pieces) - 4 - len(shared))
    old_table = source.model.weights[0].numpy()
    assert model.weights[0].path == model.target_embedding.token_embedding.embeddings.path
    for table in strategy.experimental_local_results(model.weights[0].value):
        table = table.numpy()
        assert table.shape == (400, old_table.shape[1])
        np.testing.assert_array_equal(table[:4], old_table[:4])
        for i in shared:
            np.testing.assert_array_equal(table[i], old_table[old_ids[new_pieces[i]]])
        np.testing.assert_array_equal(table[new], fresh[new])
        distance = np.abs(table[new][:, None, :] - old_table[None, :, :]).max(-1)
        assert distance.min() > 1e-3  # no new piece took any old row
    for old, weight in zip(source.model.weights[1:], model.weights[1:]):
        for value in strategy.experimental_local_results(weight.value):
            np.testing.assert_array_equal(value.numpy(), old.numpy(), err_msg=weight.path)


def test_start_initializes_a_new_directory_and_never_one_with_a_checkpoint(
        tiny_model_dir, tmp_path):
    """The record lands in init_from.json; once the directory holds a checkpoint, `start`
    leaves the model alone, so a rerun resumes the directory instead of starting over."""
    new_dir = str(tmp_path / "new")
    with open(os.path.join(tiny_model_dir, model_dir_lib.VOCAB_FILE), "rb") as f:
        proto = f.read()
    source = model_dir_lib.load_model(ModelDir(tiny_model_dir))
    model = build_model(source.config.model)
    tuned, source_dir = ModelDir(new_dir), ModelDir(tiny_model_dir)
    record = fine_tuning.start(model, tuned, source_dir, None, proto)
    assert record == ModelDir(new_dir).read_init_from()
    assert record == {"model_dir": os.path.abspath(tiny_model_dir), "step": 0,
                      "checkpoint": os.path.abspath(os.path.join(tiny_model_dir, "ckpt-0")),
                      "vocabulary": "source"}
    for old, new in zip(source.model.weights, model.weights):
        np.testing.assert_array_equal(new.numpy(), old.numpy())

    tf.train.CheckpointManager(tf.train.Checkpoint(model=model), new_dir, 1).save(5)
    resumed = build_model(source.config.model)
    before = [w.numpy() for w in resumed.weights]
    assert not all(np.array_equal(a, b.numpy()) for a, b in zip(before, source.model.weights))
    assert fine_tuning.start(resumed, tuned, source_dir, None, proto) is None
    for value, weight in zip(before, resumed.weights):
        np.testing.assert_array_equal(weight.numpy(), value)


# -- the binary ------------------------------------------------------------------------
def _env():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    env.pop("TF_CONFIG", None)
    return env


def test_flags_that_would_change_the_architecture_are_refused(tiny_model_dir, tmp_path):
    """Before anything is written."""
    new = str(tmp_path / "new")
    common = [f"--init_from={tiny_model_dir}", f"--model_dir={new}", "--train_data=x.tsv"]
    cases = {("--d_model=64",): "would change it (source, requested): {'d_model': (32, 64)}",
             ("--num_layers=2", "--num_heads=8"): "{'num_heads': (4, 8)}",
             ("--preset=tiny",): "--preset with --init_from",
             (f"--model_dir={tiny_model_dir}",): "--init_from names --model_dir itself"}
    argvs = [common + list(flags) for flags in cases]
    argvs.append([f"--init_from={tmp_path}/none:best", f"--model_dir={new}",
                  "--train_data=x.tsv"])
    messages = [*cases.values(), "no model directory (config.json)"]
    # The five runs in this process (run_mains): each launch would import TensorFlow.
    for run, message, argv in zip(run_mains("tf_transformer.train", argvs, _env()),
                                  messages, argvs, strict=True):
        assert run["code"] != 0 and message in run["stderr"], (argv, run["stderr"][-800:])
    assert not os.path.exists(new)


# The second corpus: pairs whose source names one of these (a tenth of the short pairs).
DOMAIN = re.compile(r"\b(cells?|columns?|rows?|formulas?|charts?|tables?|sheets?|spreadsheets?)\b",
                    re.I)
MAX_CHARS = 80
# The source's settings over the tiny preset (the fine-tuned run inherits them).
MODEL = {"num_layers": 1, "d_model": 32, "d_ff": 64, "num_heads": 4}
DATA = {"tokens_per_batch": 1024, "max_length": 64, "shuffle_buffer": 1000}
TRAIN = {"warmup_steps": 100, "learning_rate_scale": 2.0, "checkpoint_minutes": 1000.0,
         "divergence_steps": 0, "log_every": 10, "keep_best": 0}
SOURCE_STEPS, STEPS = 100, 30


def _write_tsv(path, sources, targets):
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(f"{s}\t{t}\n" for s, t in zip(sources, targets))
    return str(path)


@pytest.fixture(scope="module")
def two_corpora(tmp_path_factory):
    """The TSVs of the first corpus and of the second corpus's train and dev pairs, short
    pairs only."""
    pairs = corpus.read_tsv(os.path.join(EMBEDDED_CORPUS_DIR, "train.tsv"), max_chars=MAX_CHARS)
    second = [i for i, s in enumerate(pairs.sources) if DOMAIN.search(s)]
    first = sorted(set(range(len(pairs.sources))) - set(second))
    directory = tmp_path_factory.mktemp("corpora")

    def pick(ids):
        return [pairs.sources[i] for i in ids], [pairs.targets[i] for i in ids]

    return (_write_tsv(directory / "first.tsv", *pick(first[:4000])),
            _write_tsv(directory / "second.tsv", *pick(second[200:])),
            _write_tsv(directory / "second_dev.tsv", *pick(second[:200])))


def _lines(output, prefix):
    return [line for line in output.splitlines() if line.startswith(prefix)]


def _dev_loss(output):
    """The last `eval step=... dev_loss=X` line's X."""
    return float(_lines(output, "eval step=")[-1].split("dev_loss=")[1].split()[0])


@pytest.mark.slow
def test_fine_tuned_on_a_second_corpus_beats_training_on_it_from_scratch(
        tmp_path, two_corpora):
    """The same vocabulary (the second corpus's), settings and steps: `train --init_from` from
    the first corpus's model (`train` on it with its own 500-piece vocabulary, its
    embedding remapped), against `train` from scratch; the fine-tuned run starts at step 0
    at the scratch run's learning rate. The three runs run in this process (run_mains)."""
    first_tsv, second_tsv, dev_tsv = two_corpora
    first_vocab, vocab = str(tmp_path / "first.model"), str(tmp_path / "second.model")
    tokenizer.train_sentencepiece(corpus.read_tsv(first_tsv), 500, first_vocab)
    tokenizer.train_sentencepiece(corpus.read_tsv(second_tsv), 500, vocab)
    settings = ["--preset=tiny", *(f"--{k}={v}" for k, v in {**MODEL, **DATA, **TRAIN}.items())]
    common = [f"--train_data={second_tsv}", f"--vocab={vocab}", f"--dev_data={dev_tsv}",
              "--dev_bleu_sentences=0", "--dropout=0", f"--max_steps={STEPS}"]
    source, tuned_dir, scratch_dir = (str(tmp_path / name) for name in ("source", "tuned",
                                                                        "scratch"))
    runs = run_mains("tf_transformer.train", [
        [f"--model_dir={source}", f"--train_data={first_tsv}", f"--vocab={first_vocab}",
         *settings, f"--max_steps={SOURCE_STEPS}"],
        [f"--model_dir={scratch_dir}", *settings, *common],
        [f"--init_from={source}", f"--model_dir={tuned_dir}", *common]], _env())
    for run in runs:
        assert run["code"] == 0, run["stderr"][-3000:]
    scratch_out, tuned_out = runs[1]["stdout"], runs[2]["stdout"]

    tuned_config = ModelDir(tuned_dir).read_config()
    # the scratch run's settings are the same
    assert tuned_config == ModelDir(scratch_dir).read_config()
    assert tuned_config.model == dataclasses.replace(ModelDir(source).read_config().model,
                                                     dropout=0.0)
    record = ModelDir(tuned_dir).read_init_from()
    assert record["checkpoint"] == os.path.abspath(os.path.join(source, f"ckpt-{SOURCE_STEPS}"))
    assert record["step"] == SOURCE_STEPS and record["vocabulary"] == "updated"
    assert record["pieces_kept"] > 100 and record["pieces_new"] > 10
    assert _lines(tuned_out, "init_from ")[0].startswith(f"init_from model_dir={source} ")
    tuned_steps, scratch_steps = _lines(tuned_out, "step="), _lines(scratch_out, "step=")
    assert tuned_steps[0].startswith("step=10 ") and scratch_steps[0].startswith("step=10 ")
    assert tuned_steps[0].split()[2] == scratch_steps[0].split()[2]  # lr=: a fresh schedule
    tuned_loss, scratch_loss = _dev_loss(tuned_out), _dev_loss(scratch_out)
    assert tuned_loss < scratch_loss - 0.5, (tuned_loss, scratch_loss)
