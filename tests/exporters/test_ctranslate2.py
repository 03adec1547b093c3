"""CTranslate2 export (tf_transformer/exporters/ctranslate2.py): same weights, same model.

(a) CTranslate2's `score_batch` equals our model's log-probabilities of given
    (source, target) pairs, EOS included, token by token;
(b) greedy decoding gives the same ids, empty outputs (EOS first) included,
    with `translate_options` (CTranslate2's default min_decoding_length=1
    forbids them);
(c) beam search with a length penalty may not: CTranslate2 divides the
    log-probability by length**alpha, GNMT and we by ((5 + length) / 6)**alpha
    (the same length: tokens with EOS, or the maximum when forced). Every
    1-best score of both systems is checked against its formula over our
    model's log-probabilities; a test pins that the two formulas rank
    hypotheses differently; wherever the two 1-best outputs differ, another
    checks that at least one system's output is the better one under its own
    formula (beam search is approximate, so one system may miss its own
    optimum; both preferring the other's output would be unexplained).

CTranslate2 is asked not to generate <pad> and <s> (suppress_sequences), which
our beam search never generates. It removes them before its softmax (ours
after), which changes no argmax but renormalises its scores; `score_batch`
applies no suppression.
"""

import dataclasses
import os

import numpy as np
import pytest
import tensorflow as tf

ctranslate2 = pytest.importorskip("ctranslate2")

from model_fixtures import REPO_ROOT, make_model_dir  # noqa: E402

from tf_transformer.config import BOS_ID, EOS_ID, PAD_ID, DecodeConfig  # noqa: E402
from tf_transformer.search.beam_search import length_penalty  # noqa: E402
from tf_transformer.decoding.translator import Translator  # noqa: E402
from tf_transformer.exporters import ctranslate2 as ct2_export  # noqa: E402
from tf_transformer.inputs import corpus  # noqa: E402
from tf_transformer.model_dir import ModelDir  # noqa: E402

DEV_TSV = os.path.join(REPO_ROOT,
                       "data", "libreoffice-help.en-de", "dev.tsv")
EXTRA_LENGTH = 10
# One search per batch (parallel_searches=1): each Translator's search graph holds one copy
# of the loop, not three (its first call costs about a third); the parallel sub-batches
# give one search's outputs (tests/decoding/test_translator.py).
GREEDY = DecodeConfig(beam_size=1, alpha=0.0, extra_length=EXTRA_LENGTH, parallel_searches=1)
BEAM = DecodeConfig(beam_size=4, extra_length=EXTRA_LENGTH, parallel_searches=1)
SUPPRESS = [["<pad>"], ["<s>"]]  # our beam search never generates PAD or BOS


@pytest.fixture(scope="module")
def pairs():
    dev = corpus.read_tsv(DEV_TSV, max_chars=60)
    return dev.sources[:16], dev.targets[:16]


def _convert(model_dir, tmp_path_factory, name):
    output = str(tmp_path_factory.mktemp("ct2") / name)
    ct2_export.export_ctranslate2(ModelDir(model_dir), output)
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
    ours = Translator.from_model_dir(ModelDir(model_dir))
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
    ct2_export.run_export(ModelDir(tiny_model_dir), output)
    assert {"model.bin", "config.json", "shared_vocabulary.json",
            ct2_export.SENTENCEPIECE_FILE, ct2_export.METADATA_FILE} <= set(os.listdir(output))
    ct2_export.run_export(ModelDir(tiny_model_dir), output)  # replaces its own output
    other = tmp_path_factory.mktemp("not_empty")
    (other / "keep.txt").write_text("not a CTranslate2 model")
    with pytest.raises(FileExistsError):
        ct2_export.run_export(ModelDir(tiny_model_dir), str(other))


def test_special_tokens_line_up(tiny_model_dir, tmp_path_factory):
    import json

    output = ct2_export.export_ctranslate2(
        ModelDir(tiny_model_dir), str(tmp_path_factory.mktemp("ct2") / "vocab"))
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


def _greedy_ids_equal(ours, ct2, piece_ids, source_ids, min_decoding_length=None):
    """Our greedy ids against CTranslate2's with translate_options (EOS included): the
    rows that differ where the first difference is more than a near-tie; [] expected."""
    options = ct2_export.translate_options(GREEDY)
    if min_decoding_length is not None:
        options["min_decoding_length"] = min_decoding_length
    result = ours.translate_ids(source_ids)
    unexplained, outputs = [], []
    for row, ids in enumerate(source_ids):
        length = int((ids != 0).sum())  # EOS included, as our max length counts it
        ct2_result = ct2.translate_batch(
            [_pieces(ours, ids[:length - 1])], max_decoding_length=length + EXTRA_LENGTH,
            **options)[0]
        ours_ids = list(result["ids"].numpy()[row, 0, :result["lengths"].numpy()[row, 0]])
        ct2_ids = [piece_ids[t] for t in ct2_result.hypotheses[0]]
        if len(ct2_ids) < length + EXTRA_LENGTH:
            ct2_ids.append(EOS_ID)  # ended by EOS, which CTranslate2 does not return
        outputs.append(ours_ids)
        if ct2_ids != ours_ids:  # only a near-tie between two tokens may flip the argmax
            k = next(i for i, (a, b) in enumerate(zip(ct2_ids, ours_ids)) if a != b)
            log_probs = _step_log_probs(ours, ids[:length - 1], ours_ids[:k])
            if abs(log_probs[ct2_ids[k]] - log_probs[ours_ids[k]]) >= 1e-4:
                unexplained.append((row, k, float(log_probs[ct2_ids[k]] - log_probs[ours_ids[k]])))
    return unexplained, outputs


def test_trained_scores_and_greedy_ids_equal(trained_tiny_model_dir, spm_model_path,
                                             tmp_path_factory, pairs):
    ct2 = _convert(trained_tiny_model_dir, tmp_path_factory, "trained")
    piece_ids = {p: i for i, p in enumerate(ct2_export.vocabulary_pieces(spm_model_path))}
    _check_scores(trained_tiny_model_dir, ct2, pairs)
    ours = Translator.from_model_dir(ModelDir(trained_tiny_model_dir), decode_config=GREEDY)
    source_ids = ours.source_ids(tf.constant(pairs[0])).numpy()
    unexplained, _ = _greedy_ids_equal(ours, ct2, piece_ids, source_ids)
    assert not unexplained


@pytest.fixture(scope="module")
def eos_first(tiny_model_dir, spm_model_path, tmp_path_factory, pairs):
    """(Translator, CTranslate2 translator, piece ids, source ids) of the tiny model with
    the EOS row set to twice the row of its most frequent first greedy token: most of
    the pairs then translate to EOS alone (an empty output), the others do not."""
    ours = Translator.from_model_dir(ModelDir(tiny_model_dir), decode_config=GREEDY)
    source_ids = ours.source_ids(tf.constant(pairs[0])).numpy()
    first = ours.translate_ids(source_ids)["ids"].numpy()[:, 0, 0]
    table = ours.model.target_embedding.token_embedding.embeddings
    favourite = int(np.bincount(first).argmax())
    table.assign(tf.tensor_scatter_nd_update(table, [[EOS_ID]], 2.0 * table[favourite:favourite + 1]))
    output = str(tmp_path_factory.mktemp("ct2") / "eos_first")
    ct2_export.TransformerConverter(ours.model, ct2_export.vocabulary_pieces(spm_model_path)) \
        .convert(output)
    ct2 = ctranslate2.Translator(output, device="cpu", intra_threads=1)
    piece_ids = {p: i for i, p in enumerate(ct2_export.vocabulary_pieces(spm_model_path))}
    return ours, ct2, piece_ids, source_ids


def test_empty_outputs_agree_with_translate_options(eos_first):
    """translate_options lets CTranslate2 end with EOS first, as our search may: with its
    default min_decoding_length=1 it replaces each empty output by another token.
    (This was a flake of the trained test: a trained fixture whose first-step argmax
    was EOS for a source made CTranslate2 pick the runner-up, 0.08 below.)"""
    ours, ct2, piece_ids, source_ids = eos_first
    unexplained, outputs = _greedy_ids_equal(ours, ct2, piece_ids, source_ids)
    assert not unexplained
    empty = [row for row, ids in enumerate(outputs) if ids == [EOS_ID]]
    assert 0 < len(empty) < len(outputs), outputs
    unexplained, _ = _greedy_ids_equal(ours, ct2, piece_ids, source_ids, min_decoding_length=1)
    assert sorted(row for row, k, _ in unexplained) == empty


def _step_log_probs(translator, source, prefix):
    """Our model's log-probabilities [vocab] of the token after BOS + prefix."""
    logits = translator.model({"source": tf.constant([list(source) + [EOS_ID]]),
                               "target_in": tf.constant([[BOS_ID] + list(prefix)])},
                              training=False)
    return tf.nn.log_softmax(logits[0, -1]).numpy()


def _ours_score(log_prob, length, alpha):
    """Our beam search's score: log P / GNMT's penalty of |Y| (EOS included)."""
    return log_prob / float(length_penalty(length, alpha))


def _ct2_score(log_prob, length, alpha):
    """CTranslate2's: log P / |Y|**alpha, the same |Y| (decoding steps, EOS included;
    test_beam_scores_follow_each_formula checks it against CTranslate2's scores)."""
    return log_prob / length ** alpha


def test_length_penalties_rank_lengths_differently():
    """A 2-token hypothesis (+EOS) against a 5-token one at the configured alpha:
    our length penalty keeps the short one, CTranslate2 given translate_options the long."""
    decode = DecodeConfig()
    options = ct2_export.translate_options(decode)
    assert options["length_penalty"] == decode.alpha == 0.6
    short, long = -3.0, -4.0  # log-probs, EOS included
    assert _ours_score(short, 3, decode.alpha) > _ours_score(long, 6, decode.alpha)
    assert _ct2_score(long, 6, options["length_penalty"]) > _ct2_score(
        short, 3, options["length_penalty"])
    # GNMT's penalty itself: ((5 + |Y|) / 6) ** alpha, 1 for |Y| = 1.
    np.testing.assert_allclose(length_penalty(np.array([1, 3, 6]), 0.6).numpy(),
                               [1.0, (8 / 6) ** 0.6, (11 / 6) ** 0.6], rtol=1e-6)


def _batch_log_probs(translator, sources, outputs, max_lengths):
    """(log P, log P as CTranslate2 computes it, |Y|) of each output (ids without EOS),
    one padded forward pass for all.

    Shorter than its max_length, an output ended with EOS, which log P and |Y|
    count. At max_length it was forced to stop: no EOS.
    """
    width = max(len(y) for y in outputs) + 1
    source = [list(x) + [EOS_ID] + [PAD_ID] * (max(map(len, sources)) - len(x)) for x in sources]
    target_in = [[BOS_ID] + list(y) + [PAD_ID] * (width - 1 - len(y)) for y in outputs]
    logits = translator.model({"source": tf.constant(source), "target_in": tf.constant(target_in)},
                              training=False)
    never = np.isin(np.arange(logits.shape[-1]), [PAD_ID, BOS_ID])
    plain = tf.nn.log_softmax(logits).numpy()
    suppressed = tf.nn.log_softmax(tf.where(never, float("-inf"), logits)).numpy()
    results = []
    for row, (y, max_length) in enumerate(zip(outputs, max_lengths)):
        ended = len(y) < max_length
        target = list(y) + [EOS_ID] if ended else list(y)
        steps = np.arange(len(target))
        results.append((float(plain[row, steps, target].sum()),
                        float(suppressed[row, steps, target].sum()), len(target)))
    return results


def _beam_check(ours, ct2, piece_ids, source_ids, alphas):
    """Each system's 1-best score equals its own formula over our model's log-probs;
    returns the (alpha, row) whose outputs differ and whether each is explained."""
    lengths = (source_ids != PAD_ID).sum(axis=1)  # EOS included
    sources = [list(ids[:n - 1]) for ids, n in zip(source_ids, lengths)]
    max_lengths = [int(n) + EXTRA_LENGTH for n in lengths]
    differences, explained = [], []
    for alpha in alphas:
        options = ct2_export.translate_options(dataclasses.replace(BEAM, alpha=alpha))
        result = ours.translate_ids(source_ids, alpha)
        ours_ids, ct2_ids, ct2_scores = [], [], []
        for row, source in enumerate(sources):
            ct2_result = ct2.translate_batch([_pieces(ours, source)],
                                             max_decoding_length=max_lengths[row],
                                             return_scores=True, **options)[0]
            ct2_ids.append([piece_ids[t] for t in ct2_result.hypotheses[0]])
            ct2_scores.append(ct2_result.scores[0])
            ids = list(result["ids"].numpy()[row, 0, :result["lengths"].numpy()[row, 0]])
            ours_ids.append(ids[:-1] if ids[-1] == EOS_ID else ids)
        ours_h = _batch_log_probs(ours, sources, ours_ids, max_lengths)
        ct2_h = _batch_log_probs(ours, sources, ct2_ids, max_lengths)
        assert [h[2] for h in ours_h] == list(result["lengths"].numpy()[:, 0])
        np.testing.assert_allclose(result["scores"].numpy()[:, 0],
                                   [_ours_score(h[0], h[2], alpha) for h in ours_h],
                                   rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(ct2_scores, [_ct2_score(h[1], h[2], alpha) for h in ct2_h],
                                   rtol=1e-4, atol=1e-5)
        for row in range(len(sources)):
            if ct2_ids[row] == ours_ids[row]:
                continue
            differences.append((alpha, row))
            o, c = ours_h[row], ct2_h[row]
            # A difference is explained when at least one system's output is the better
            # one under its own formula. Beam search is approximate, so either system
            # may miss its own optimum; only both ranking the other's output higher
            # would be unexplained (and would point at the converted weights).
            explained.append(_ours_score(o[0], o[2], alpha) >= _ours_score(c[0], c[2], alpha) - 1e-4
                             or _ct2_score(c[1], c[2], alpha) >= _ct2_score(o[1], o[2], alpha) - 1e-4)
    return differences, explained


def test_beam_scores_follow_each_formula(trained_tiny_model_dir, spm_model_path, tmp_path_factory,
                                         pairs, eos_first):
    """On the trained model (outputs mostly forced at the maximum length) and on the
    EOS-prone one at beam 4 (outputs of every length, so the penalties matter)."""
    ct2 = _convert(trained_tiny_model_dir, tmp_path_factory, "beam")
    piece_ids = {p: i for i, p in enumerate(ct2_export.vocabulary_pieces(spm_model_path))}
    ours = Translator.from_model_dir(ModelDir(trained_tiny_model_dir), decode_config=BEAM)
    source_ids = ours.source_ids(tf.constant(pairs[0])).numpy()
    differences, explained = _beam_check(ours, ct2, piece_ids, source_ids, (0.6, 1.0, 2.0))
    eos_ours, eos_ct2, _, _ = eos_first
    eos_ours = Translator(eos_ours.model, eos_ours.tokenizer, BEAM, eos_ours.max_source_length)
    more = _beam_check(eos_ours, eos_ct2, piece_ids, source_ids, (0.0, 0.6, 2.0))
    # Both searches may miss their own optimum (beam 4), and the trained fixture is not
    # bit-reproducible, so in rare runs a near-tie prunes differently in the two systems and
    # each ranks the other's output higher (seen once in a full-suite run; the solo rerun
    # passed). Wrong converted weights fail the score checks above on every output, and
    # would leave many differences unexplained: one is tolerated per model.
    assert explained.count(False) <= 1 and more[1].count(False) <= 1, (differences, explained,
                                                                        more)
    assert more[0]  # the seeded EOS-prone model's outputs do differ (at alpha 2)
    # How many 1-best outputs differ varies with the trained fixture (its training
    # is not bit-reproducible); the scores above are checked on every output.
    print(f"1-best outputs that differ (alpha, row): {differences}, eos-prone: {more[0]}")
