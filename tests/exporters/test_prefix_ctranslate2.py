"""Target prefixes (search/prefix.py) against CTranslate2's `target_prefix` on our CTranslate2
export of the same weights: greedy outputs forced through the same prefix pieces give the
same ids (the prefix, then the free continuation), as test_ctranslate2.py's greedy test
checks without a prefix."""

import numpy as np
import pytest
import tensorflow as tf

ctranslate2 = pytest.importorskip("ctranslate2")

from tf_transformer.config import BOS_ID, EOS_ID, DecodeConfig  # noqa: E402
from tf_transformer.decoding.translator import Translator  # noqa: E402
from tf_transformer.exporters import ctranslate2 as ct2_export  # noqa: E402
from tf_transformer.model_dir import ModelDir  # noqa: E402
from tf_transformer.search import prefix as prefix_lib  # noqa: E402

EXTRA_LENGTH = 6
GREEDY = DecodeConfig(beam_size=1, alpha=0.0, extra_length=EXTRA_LENGTH)
SOURCES = ["Fonts", "Replacement table", "Enables the font replacement settings.",
           "Always checkbox", "Screen only", "checked"]
PREFIXES = ["Schrift", "Die Tabelle", "", "Immer das", "x", "Wenn Sie nicht"]


def _pieces(translator, ids):
    return [p.decode() for p in translator.tokenizer.id_to_piece(
        tf.constant(list(ids), tf.int32)).numpy()]


def _step_log_probs(translator, source_ids, output):
    """Our model's next-token log-probs after `output` (no BOS) for one source."""
    logits = translator.model({"source": tf.constant([list(source_ids)]),
                               "target_in": tf.constant([[BOS_ID] + list(output)])},
                              training=False)
    return tf.nn.log_softmax(logits[0, -1]).numpy()


def test_greedy_with_a_prefix_gives_ctranslate2s_ids(tiny_model_dir, spm_model_path,
                                                    tmp_path_factory):
    output = str(tmp_path_factory.mktemp("ct2") / "tiny")
    ct2_export.export_ctranslate2(ModelDir(tiny_model_dir), output)
    ct2 = ctranslate2.Translator(output, device="cpu", intra_threads=1)
    piece_ids = {p: i for i, p in enumerate(ct2_export.vocabulary_pieces(spm_model_path))}
    ours = Translator.from_model_dir(ModelDir(tiny_model_dir), decode_config=GREEDY)
    source_ids = ours.source_ids(tf.constant(SOURCES)).numpy()
    prefix_ids = ours.target_tokenizer.tokenize(tf.constant(PREFIXES)).to_list()
    width = max(map(len, prefix_ids))
    prefix = prefix_lib.from_ids(tf.constant([p + [0] * (width - len(p)) for p in prefix_ids],
                                             tf.int32, shape=[len(SOURCES), width]))
    result = ours.model_search.run(tf.constant(source_ids), tf.constant(0.0),
                                   tf.constant(EXTRA_LENGTH), 1, prefix=prefix)
    unexplained = []
    for row, ids in enumerate(source_ids):
        length = int((ids != 0).sum())  # EOS included, as our max length counts it
        max_length = max(length + EXTRA_LENGTH, len(prefix_ids[row]) + 1)
        hypothesis = ct2.translate_batch(
            [_pieces(ours, ids[:length - 1])], target_prefix=[_pieces(ours, prefix_ids[row])],
            max_decoding_length=max_length, **ct2_export.translate_options(GREEDY))[0]
        ct2_ids = [piece_ids[t] for t in hypothesis.hypotheses[0]]
        if len(ct2_ids) < max_length:
            ct2_ids.append(EOS_ID)  # ended by EOS, which CTranslate2 does not return
        ours_ids = list(result.ids.numpy()[row, 0, :result.lengths.numpy()[row, 0]])
        assert ours_ids[:len(prefix_ids[row])] == prefix_ids[row]
        if ct2_ids != ours_ids:  # only a near-tie between two tokens may flip the argmax
            k = next((i for i, (a, b) in enumerate(zip(ct2_ids, ours_ids)) if a != b),
                     min(len(ct2_ids), len(ours_ids)))
            assert k >= len(prefix_ids[row]), (row, ct2_ids, ours_ids)
            log_probs = _step_log_probs(ours, ids[:length], ours_ids[:k])
            if k >= min(len(ct2_ids), len(ours_ids)) or abs(
                    log_probs[ct2_ids[k]] - log_probs[ours_ids[k]]) >= 1e-4:
                unexplained.append((row, k, ct2_ids, ours_ids))
    assert not unexplained
    assert len({len(p) for p in prefix_ids}) > 2 and np.all(result.lengths.numpy() > 1)
