"""CTranslate2 export (tf_transformer/exporters/ctranslate2.py): same weights, same model.

(a) CTranslate2's `score_batch` equals our model's log-probabilities of given
    (source, target) pairs, EOS included, token by token;
(b) greedy decoding gives the same ids;
(c) beam search with a length penalty may not: CTranslate2 divides the
    log-probability by length**alpha (length without EOS), GNMT and we by
    ((5 + length) / 6)**alpha (length with EOS). A test pins that the two
    formulas rank hypotheses differently; wherever the two 1-best outputs
    differ, another checks that at least one system's output is the better one
    under its own formula (beam search is approximate, so one system may miss
    its own optimum; both preferring the other's output would be unexplained).

CTranslate2 is asked not to generate <pad> and <s> (suppress_sequences), which
our beam search never generates. It removes them before its softmax (ours
after), which changes no argmax; `score_batch` applies no suppression.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

ctranslate2 = pytest.importorskip("ctranslate2")

from model_fixtures import REPO_ROOT, make_model_dir  # noqa: E402

from tf_transformer.config import BOS_ID, EOS_ID, DecodeConfig  # noqa: E402
from tf_transformer.decoding.translator import Translator  # noqa: E402
from tf_transformer.exporters import ctranslate2 as ct2_export  # noqa: E402
from tf_transformer.inputs import corpus  # noqa: E402

DEV_TSV = os.path.join(REPO_ROOT,
                       "data", "libreoffice-help.en-de", "dev.tsv")
EXTRA_LENGTH = 10
SUPPRESS = [["<pad>"], ["<s>"]]  # our beam search never generates PAD or BOS


@pytest.fixture(scope="module")
def pairs():
    dev = corpus.read_tsv(DEV_TSV, max_chars=60)
    return dev.sources[:16], dev.targets[:16]


@pytest.fixture(scope="module")
def trained_model_dir(tmp_path_factory, spm_model_path):
    """The tiny model after 120 steps: it emits EOS, so lengths (and penalties) vary."""
    with open(spm_model_path, "rb") as f:
        proto = f.read()
    return make_model_dir(str(tmp_path_factory.mktemp("model") / "trained"), proto, steps=120)


def _convert(model_dir, tmp_path_factory, name):
    output = str(tmp_path_factory.mktemp("ct2") / name)
    ct2_export.export_ctranslate2(model_dir, output)
    return ctranslate2.Translator(output, device="cpu", intra_threads=1)


def _pieces(translator, ids):
    return [p.decode() for p in translator.tokenizer.id_to_piece(
        tf.constant(list(ids), tf.int32)).numpy()]


def _log_probs(translator, source_ids, target_ids):
    """Our model's log P(y_t | y_<t, x) of each target token, EOS included: [T + 1]."""
    target = list(target_ids) + [EOS_ID]
    logits = translator.model({"source": tf.constant([list(source_ids) + [EOS_ID]]),
                               "target_in": tf.constant([[BOS_ID] + target[:-1]])},
                              training=False)
    log_probs = tf.nn.log_softmax(logits[0]).numpy()
    return log_probs[np.arange(len(target)), target]


def _check_scores(model_dir, ct2, pairs):
    ours = Translator.from_model_dir(model_dir)
    sources = ours.tokenizer.tokenize(tf.constant(pairs[0])).to_list()
    targets = ours.tokenizer.tokenize(tf.constant(pairs[1])).to_list()
    results = ct2.score_batch([_pieces(ours, s) for s in sources],
                              [_pieces(ours, t) for t in targets])
    for source, target, result in zip(sources, targets, results):
        assert result.tokens == _pieces(ours, target) + ["</s>"]
        np.testing.assert_allclose(result.log_probs, _log_probs(ours, source, target),
                                   rtol=1e-4, atol=1e-4)


def test_exported_directory(tiny_model_dir, tmp_path_factory):
    output = str(tmp_path_factory.mktemp("ct2") / "files")
    ct2_export.run_export(tiny_model_dir, output)
    assert {"model.bin", "config.json", "shared_vocabulary.json",
            ct2_export.SENTENCEPIECE_FILE, ct2_export.METADATA_FILE} <= set(os.listdir(output))
    ct2_export.run_export(tiny_model_dir, output)  # replaces its own output
    other = tmp_path_factory.mktemp("not_empty")
    (other / "keep.txt").write_text("not a CTranslate2 model")
    with pytest.raises(FileExistsError):
        ct2_export.run_export(tiny_model_dir, str(other))


def test_special_tokens_line_up(tiny_model_dir, tmp_path_factory):
    import json

    output = ct2_export.export_ctranslate2(
        tiny_model_dir, str(tmp_path_factory.mktemp("ct2") / "vocab"))
    with open(os.path.join(output, "shared_vocabulary.json")) as f:
        vocabulary = json.load(f)
    with open(os.path.join(output, "config.json")) as f:
        config = json.load(f)
    assert vocabulary[:4] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert (config["unk_token"], config["bos_token"], config["eos_token"],
            config["decoder_start_token"]) == ("<unk>", "<s>", "</s>", "<s>")
    assert config["add_source_eos"] and not config["add_source_bos"]


@pytest.mark.parametrize("variant", [{}, {"pre_norm": True, "positions": "learned"}],
                         ids=["post_norm_sinusoid", "pre_norm_learned"])
def test_score_batch_equals_our_log_probs(variant, tiny_model_dir, spm_model_path,
                                          tmp_path_factory, pairs):
    model_dir = tiny_model_dir
    if variant:
        with open(spm_model_path, "rb") as f:
            model_dir = make_model_dir(str(tmp_path_factory.mktemp("model") / "variant"),
                                       f.read(), steps=0, **variant)
    _check_scores(model_dir, _convert(model_dir, tmp_path_factory, "scores"), pairs)


def test_trained_scores_and_greedy_ids_equal(trained_model_dir, spm_model_path,
                                             tmp_path_factory, pairs):
    ct2 = _convert(trained_model_dir, tmp_path_factory, "trained")
    piece_ids = {p: i for i, p in enumerate(ct2_export.vocabulary_pieces(spm_model_path))}
    _check_scores(trained_model_dir, ct2, pairs)
    ours = Translator.from_model_dir(trained_model_dir, decode_config=DecodeConfig(
        beam_size=1, alpha=0.0, extra_length=EXTRA_LENGTH))
    source_ids = ours.source_ids(tf.constant(pairs[0])).numpy()
    result = ours.translate_ids(source_ids)
    for row, ids in enumerate(source_ids):
        length = int((ids != 0).sum())  # EOS included, as our max length counts it
        ct2_result = ct2.translate_batch(
            [_pieces(ours, ids[:length - 1])], beam_size=1, length_penalty=0.0,
            max_decoding_length=length + EXTRA_LENGTH, suppress_sequences=SUPPRESS,
            return_end_token=False)[0]
        ours_ids = list(result["ids"].numpy()[row, 0, :result["lengths"].numpy()[row, 0]])
        ct2_ids = [piece_ids[t] for t in ct2_result.hypotheses[0]]
        if len(ct2_ids) < length + EXTRA_LENGTH:
            ct2_ids.append(EOS_ID)  # ended by EOS, which CTranslate2 does not return
        if ct2_ids != ours_ids:  # only a near-tie between two tokens may flip the argmax
            k = next(i for i, (a, b) in enumerate(zip(ct2_ids, ours_ids)) if a != b)
            log_probs = _step_log_probs(ours, ids[:length - 1], ours_ids[:k])
            assert abs(log_probs[ct2_ids[k]] - log_probs[ours_ids[k]]) < 1e-4, (row, k)


def _step_log_probs(translator, source, prefix):
    """Our model's log-probabilities [vocab] of the token after BOS + prefix."""
    logits = translator.model({"source": tf.constant([list(source) + [EOS_ID]]),
                               "target_in": tf.constant([[BOS_ID] + list(prefix)])},
                              training=False)
    return tf.nn.log_softmax(logits[0, -1]).numpy()


def test_length_penalties_rank_lengths_differently():
    """The formulas alone: a 2-token hypothesis (+EOS) against a 5-token one, alpha 0.6."""
    alpha = 0.6
    short, long = -3.0, -4.0  # log-probs, EOS included

    def gnmt(log_prob, tokens_with_eos):
        return log_prob / ((5.0 + tokens_with_eos) / 6.0) ** alpha

    def ctranslate2_penalty(log_prob, tokens_with_eos):
        return log_prob / (tokens_with_eos - 1) ** alpha  # EOS not counted by default

    assert gnmt(short, 3) > gnmt(long, 6)  # GNMT keeps the short one ...
    assert ctranslate2_penalty(long, 6) > ctranslate2_penalty(short, 3)  # ... CT2 the long one


def _hypothesis(translator, source, tokens, max_length):
    """(log P, GNMT length |Y|, CTranslate2 length) of an output without its EOS.

    Shorter than max_length: it ended with EOS, which log P and |Y| count and
    CTranslate2's length does not. At max_length it was forced to stop: no EOS.
    """
    log_probs = _log_probs(translator, source, tokens)
    if len(tokens) < max_length:
        return float(log_probs.sum()), len(tokens) + 1, len(tokens)
    return float(log_probs[:-1].sum()), len(tokens), len(tokens)


def test_beam_differences_follow_the_length_penalty(trained_model_dir, spm_model_path,
                                                    tmp_path_factory, pairs):
    ct2 = _convert(trained_model_dir, tmp_path_factory, "beam")
    piece_ids = {p: i for i, p in enumerate(ct2_export.vocabulary_pieces(spm_model_path))}
    ours = Translator.from_model_dir(trained_model_dir, decode_config=DecodeConfig(
        beam_size=4, extra_length=EXTRA_LENGTH))
    source_ids = ours.source_ids(tf.constant(pairs[0])).numpy()
    differences, explained = [], []
    for alpha in (0.6, 1.0, 2.0):
        result = ours.translate_ids(source_ids, alpha)
        for row, ids in enumerate(source_ids):
            length = int((ids != 0).sum())
            max_length = length + EXTRA_LENGTH
            # CTranslate2's defaults: EOS neither returned nor counted in the length.
            ct2_tokens = ct2.translate_batch(
                [_pieces(ours, ids[:length - 1])], beam_size=4, length_penalty=alpha,
                max_decoding_length=max_length, suppress_sequences=SUPPRESS)[0].hypotheses[0]
            n = result["lengths"].numpy()[row, 0]
            ours_ids = list(result["ids"].numpy()[row, 0, :n])
            ours_ids = ours_ids[:-1] if ours_ids[-1] == EOS_ID else ours_ids
            ct2_ids = [piece_ids[t] for t in ct2_tokens]
            if ct2_ids == ours_ids:
                continue
            differences.append((alpha, row))
            source = list(ids[:length - 1])
            hyps = {name: _hypothesis(ours, source, y, max_length)
                    for name, y in (("ours", ours_ids), ("ct2", ct2_ids))}

            def gnmt(h):
                return h[0] / ((5.0 + h[1]) / 6.0) ** alpha

            def ct2_score(h):  # an empty output scores -inf in CTranslate2 (x / 0)
                return h[0] / h[2] ** alpha if h[2] else float("-inf")

            # A difference is explained when at least one system's output is the better
            # one under its own formula. Beam search is approximate, so either system
            # may miss its own optimum; only both ranking the other's output higher
            # would be unexplained (and would point at the converted weights).
            explained.append(gnmt(hyps["ours"]) >= gnmt(hyps["ct2"]) - 1e-4
                             or ct2_score(hyps["ct2"]) >= ct2_score(hyps["ours"]) - 1e-4)
    assert all(explained), (differences, explained)
    # The tiny model's training is not bit-reproducible, so how many outputs
    # differ varies from run to run (usually a few of the 48, sometimes none);
    # test_length_penalties_rank_lengths_differently pins the formulas themselves.
    print(f"1-best outputs that differ (alpha, row): {differences}")
