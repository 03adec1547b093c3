"""evaluation.py: corpus scores, and dev BLEU that tracks what the model learned.

The dev BLEU tests train the tiny model (one layer each side) with the real Trainer on
four pairs until it reproduces them (label smoothing off, 50 steps), with dev_bleu_fn
as its evaluate_fn; the same pairs scored for the seeded random weights of the tiny model
directory must score near 0.
"""

import math
import os

import numpy as np
import pytest
import sacrebleu
import tensorflow as tf
from model_fixtures import GREEDY_DECODE, TRAIN_TSV, shared_translator, tiny_config

from tf_transformer.cli import evaluation
from tf_transformer.config import DecodeConfig, TrainConfig
from tf_transformer.cli.batching import translate_sentences
from tf_transformer.decoding.translator import Translator
from tf_transformer.inputs import corpus, pipeline
from tf_transformer.inputs.corpus import Corpus
from tf_transformer.model import build_model
from tf_transformer import model_dir as model_dir_lib
from tf_transformer.model_dir import ModelDir
from tf_transformer.training.trainer import Trainer

SENTENCES = [
    "Fonts",
    "Replacement table",
    "Enables the font replacement settings that you define.",
]
# The tiny model's Translator: batches below 16 are one search (parallel_searches=1: one
# copy of the search loop per graph, faster to trace). The translate binary tests' too.
DECODE = GREEDY_DECODE
# BLEU 100 at 50 steps for train and data seeds 1, 2 and 3, with one layer each side as with
# two (one: each Translator and the train step trace half the layers).
MEMORISED_STEPS = 50
MEMORISED_LAYERS = 1
MEMORISED_FLOOR = 60.0  # BLEU on the memorised pairs; 100 when every one is reproduced
GARBAGE_CEILING = 5.0
# A known pair for the paper-style score: compound, quotes, decimal comma, abbreviation.
REFERENCE_DE = 'Der "Open-Source"-Browser kostet 1,5 Millionen Euro, z.B. für Schulen.'
HYPOTHESIS_DE = 'Der "Open-Source"-Browser kostet 1,5 Millionen Euro.'
# By hand: tokenizer.perl -l de (quotes and final punctuation split off, "1,5" and the
# nonbreaking prefix "z.B." kept whole, "-Browser" keeps its dash), then a-b -> a ##AT##-##AT## b.
REFERENCE_DE_TOKENS = ('Der " Open ##AT##-##AT## Source " -Browser kostet 1,5 Millionen Euro , '
                       'z.B. für Schulen .')  # 16 tokens
HYPOTHESIS_DE_TOKENS = 'Der " Open ##AT##-##AT## Source " -Browser kostet 1,5 Millionen Euro .'
# 12 hypothesis tokens: the reference's first 11, then "." (in the reference, "Euro ." is not):
# n-gram precisions 12/12, 10/11, 9/10, 8/9; brevity penalty exp(1 - 16/12).
KNOWN_TOK_BLEU = 100 * math.exp(1 - 16 / 12) * (1 * 10 / 11 * 9 / 10 * 8 / 9) ** 0.25  # 66.17


@pytest.fixture(scope="module")
def toy_pairs():
    """Four short training pairs with targets of 4+ words (so BLEU has 4-grams)."""
    pairs = corpus.read_tsv(TRAIN_TSV, max_chars=40)
    chosen = [(s, t) for s, t in zip(pairs.sources, pairs.targets) if len(t.split()) >= 4][:4]
    return Corpus([s for s, _ in chosen], [t for _, t in chosen])


@pytest.fixture(scope="module")
def memorised(tmp_path_factory, spm_model_path, small_tokenizer, toy_pairs):
    """(Trainer after MEMORISED_STEPS on toy_pairs, its config, the evaluation log lines,
    the dev_bleu_fn it ran)."""
    config = tiny_config(small_tokenizer.vocab_size, num_layers=MEMORISED_LAYERS)
    config = config.replace(
        # One bucket: every batch holds every pair.
        data=config.data.__class__(max_length=24, min_bucket=24, tokens_per_batch=512,
                                   shuffle_buffer=100, deterministic=True),
        train=TrainConfig(label_smoothing=0.0, warmup_steps=30, learning_rate_scale=0.5,
                          log_every=50, checkpoint_minutes=1e9),
        decode=DecodeConfig(beam_size=1, extra_length=10, batch_size=8, parallel_searches=1))
    model_dir = str(tmp_path_factory.mktemp("memorised") / "model")
    with open(spm_model_path, "rb") as f:
        ModelDir(model_dir).prepare(config, f.read())
    trainer = Trainer(config, model_dir, tf.distribute.OneDeviceStrategy("/cpu:0"))
    lines = []
    dev_bleu = evaluation.dev_bleu_fn(toy_pairs, small_tokenizer, config)
    trainer.train(lambda step: pipeline.dataset_fn(toy_pairs, small_tokenizer, config.data,
                                                   training=True),
                  max_steps=MEMORISED_STEPS, log_fn=lines.append, evaluate_fn=dev_bleu)
    return trainer, config, [line for line in lines if line.startswith("eval ")], dev_bleu


@pytest.mark.slow
def test_dev_bleu_of_a_memorised_set_is_high(memorised, toy_pairs, small_tokenizer):
    trainer, _, eval_lines, dev_bleu = memorised
    assert eval_lines[-1].startswith(f"eval step={MEMORISED_STEPS} dev_bleu=")
    logged = float(eval_lines[-1].rsplit("=", 1)[1])
    assert logged >= MEMORISED_FLOOR, eval_lines
    assert dev_bleu(trainer.model)["dev_bleu"] == pytest.approx(logged, abs=1e-3)


@pytest.mark.slow
def test_dev_bleu_of_random_weights_is_near_zero(random_translator, random_dev_bleu):
    # The tiny model directory's seeded ckpt-0, not trained; three of the four pairs.
    metrics = random_dev_bleu(random_translator.model)
    assert metrics["dev_bleu"] < GARBAGE_CEILING


@pytest.mark.slow
def test_evaluate_translator_on_the_memorised_set(memorised, toy_pairs, small_tokenizer):
    trainer, config, _, _ = memorised
    translator = Translator(trainer.model, small_tokenizer, config.decode, config.data.max_length)
    metrics = evaluation.evaluate_translator(translator, toy_pairs, batch_size=2)
    assert metrics["sentences"] == 4 and len(metrics["hypotheses"]) == 4
    assert metrics["bleu"] >= MEMORISED_FLOOR and metrics["chrf"] >= MEMORISED_FLOOR
    scores = evaluation.corpus_scores(metrics["hypotheses"], toy_pairs.targets)
    assert {k: metrics[k] for k in scores} == scores
    first = evaluation.evaluate_translator(translator, toy_pairs, batch_size=2, max_sentences=1)
    assert first["sentences"] == 1 and first["hypotheses"] == metrics["hypotheses"][:1]
    # Tokens per second counts the generated tokens (EOS included) of the hypotheses.
    tokens = sum(r.lengths[0] for r in translate_sentences(translator, toy_pairs.sources))
    assert metrics["tokens_per_sec"] / metrics["sentences_per_sec"] == pytest.approx(
        tokens / 4, rel=1e-6)


@pytest.fixture(scope="module")
def random_translator(tiny_model_dir):
    """Translator.from_model_dir of the tiny model (seeded random weights), beam 1: the one
    the translate binary tests compare with (model_fixtures.shared_translator)."""
    return shared_translator(tiny_model_dir, DECODE)


@pytest.fixture(scope="module")
def random_dev_bleu(tiny_model_dir, random_translator, toy_pairs):
    """dev_bleu_fn over the first 3 of toy_pairs with DECODE: its Translator, built at the
    first call, serves both tests that score the random weights (one trace)."""
    config = ModelDir(tiny_model_dir).read_config().replace(decode=DECODE)
    return evaluation.dev_bleu_fn(toy_pairs, random_translator.tokenizer, config,
                                  max_sentences=3)


def test_from_model_dir_and_dev_bleu(tiny_model_dir, random_translator, random_dev_bleu,
                                     toy_pairs):
    """from_model_dir: config.json's model and source limit, the latest checkpoint's
    weights, vocab.model and the decode settings given."""
    translator = random_translator
    config = ModelDir(tiny_model_dir).read_config()
    latest = tf.train.latest_checkpoint(tiny_model_dir)
    model = build_model(config.model)
    tf.train.Checkpoint(model=model).restore(latest).expect_partial()
    assert translator.checkpoint_paths == (latest,)
    assert len(translator.model.weights) == len(model.weights)
    for got, expected in zip(translator.model.weights, model.weights):
        np.testing.assert_array_equal(got.numpy(), expected.numpy(), err_msg=expected.path)
    with open(os.path.join(tiny_model_dir, model_dir_lib.VOCAB_FILE), "rb") as f:
        assert translator.tokenizer.model_proto == f.read()
    assert translator.max_source_length == config.data.max_length
    assert (translator.beam_size, translator.extra_length) == (1, 5)
    evaluate = evaluation.combine(lambda model: {"dev_loss": 1.0}, None, random_dev_bleu)
    metrics = evaluate(translator.model)
    assert set(metrics) == {"dev_loss", "dev_bleu"} and metrics["dev_loss"] == 1.0
    # dev BLEU is sacreBLEU of the first max_sentences (3 of 4) outputs against their
    # references.
    outputs = [r.texts[0] for r in translate_sentences(translator, toy_pairs.sources[:3])]
    expected = sacrebleu.corpus_bleu(outputs, [toy_pairs.targets[:3]]).score
    assert metrics["dev_bleu"] == pytest.approx(expected, abs=1e-6)


def test_corpus_scores_and_compound_splitting():
    # As perl's s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g: matches do not overlap.
    assert evaluation.split_compounds("Drag-and-Drop, a-b-c x - y") == (
        "Drag ##AT##-##AT## and ##AT##-##AT## Drop, a ##AT##-##AT## b-c x - y")
    scores = evaluation.corpus_scores(["Das ist ein Drag-and-Drop-Test ."],
                                      ["Das ist ein Drag-and-Drop-Test ."])
    assert scores["bleu"] == pytest.approx(100.0) and scores["chrf"] == pytest.approx(100.0)
    assert scores["tok_bleu"] == pytest.approx(100.0)
    assert "tok:13a" in scores["bleu_signature"]
    worse = evaluation.corpus_scores(["Das ist ein Drag-and-Test"], ["Das ist ein Drag-and-Drop-Test ."])
    # Split compounds give partial credit where sacreBLEU sees one wrong token.
    assert worse["tok_bleu"] > worse["bleu"]


def test_paper_tokenize_is_moses_then_compound_split():
    assert evaluation.paper_tokenize(REFERENCE_DE) == REFERENCE_DE_TOKENS
    assert evaluation.paper_tokenize(f"  {HYPOTHESIS_DE} ", "de") == HYPOTHESIS_DE_TOKENS
    # Moses, not 13a: "z.B." stays one token (13a gives "z . B ."); no &quot; escaping.
    assert sacrebleu.tokenizers.tokenizer_13a.Tokenizer13a()(REFERENCE_DE).endswith(
        "z . B . für Schulen .")
    # The language picks Moses' rules: English keeps "'t" as a clitic, German splits it off.
    assert evaluation.paper_tokenize("He can't go.", "en") == "He can 't go ."
    assert evaluation.paper_tokenize("He can't go.", "de") == "He can ' t go ."


def test_tok_bleu_of_a_known_pair():
    scores = evaluation.corpus_scores([HYPOTHESIS_DE], [REFERENCE_DE])
    assert scores["tok_bleu"] == pytest.approx(KNOWN_TOK_BLEU, abs=1e-9)
    # The same figure as sacreBLEU without its own tokenizer on the hand-written tokens.
    by_hand = sacrebleu.corpus_bleu([HYPOTHESIS_DE_TOKENS], [[REFERENCE_DE_TOKENS]],
                                    tokenize="none").score
    assert scores["tok_bleu"] == pytest.approx(by_hand, abs=1e-9)
    assert "Moses tokenizer + compound split" in evaluation.TOK_BLEU_NOTE
    assert "not comparable to sacreBLEU" in evaluation.TOK_BLEU_NOTE


def test_tok_bleu_is_kept_apart_from_sacrebleu():
    scores = evaluation.corpus_scores([HYPOTHESIS_DE], [REFERENCE_DE])
    # sacreBLEU sees its own 13a tokens ("Open-Source" whole, "z . B ."): 44.87.
    assert scores["bleu"] == pytest.approx(
        sacrebleu.corpus_bleu([HYPOTHESIS_DE], [[REFERENCE_DE]]).score, abs=1e-9)
    assert scores["tok_bleu"] - scores["bleu"] > 20
    assert "tok:13a" in scores["bleu_signature"]


def test_target_lang_reaches_the_moses_tokenizer(random_translator, monkeypatch):
    hypothesis, reference = "He can't go home.", "He can't go there."
    english = evaluation.corpus_scores([hypothesis], [reference], target_lang="en")
    german = evaluation.corpus_scores([hypothesis], [reference])
    assert english["bleu"] == german["bleu"] and english["tok_bleu"] != german["tok_bleu"]
    assert english["tok_bleu"] == pytest.approx(sacrebleu.corpus_bleu(
        ["He can 't go home ."], [["He can 't go there ."]], tokenize="none").score, abs=1e-9)
    # evaluate_translator hands its target_lang to corpus_scores.
    seen = []
    real = evaluation.corpus_scores
    monkeypatch.setattr(evaluation, "corpus_scores",
                        lambda h, r, target_lang="de": seen.append(target_lang) or real(h, r))
    pairs = Corpus(SENTENCES[:1], SENTENCES[:1])
    evaluation.evaluate_translator(random_translator, pairs, batch_size=1, target_lang="en")
    evaluation.evaluate_translator(random_translator, pairs, batch_size=1)
    assert seen == ["en", "de"]


def test_corpus_scores_refuses_unpaired_lists():
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        evaluation.corpus_scores(["a", "b"], ["a"])
