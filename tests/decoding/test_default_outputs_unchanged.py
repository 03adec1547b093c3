"""The default translate path's outputs are those of the code before scoring, sampling,
alignments, byte fallback and separate vocabularies were added (commit 30b65cf): each new
option leaves them unchanged when not used.

The model's own logits would make the expected outputs depend on the CPU's rounding, so the
step is scripted: the model's decode step runs (its cache moves as always) and its logits
are replaced by distinct values 0.01 apart, a function of the last token and the step, with
EOS first on some (token, step) pairs. The recorded outputs were printed by this file's
`_outputs` at that commit, on the same 500-piece vocabulary (`spm_model_path`).
"""

import random

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.config import DecodeConfig, ModelConfig
from tf_transformer.decoding.translator import Translator
from tf_transformer.model.transformer import build_model

VOCAB = 500
TEXTS = ["Edit Points", "The functions provided allow you to edit the points.", "",
         "Click the icon."]
# Recorded at 30b65cf: beam 4, nbest 2 (translate_nbest) and beam 1 (translate).
BEAM_4_NBEST_2 = {
    "translations": [["yoom mit", "Inexteiten kön"], ["yoom mit", "Inexteiten kön"], ["", ""],
                     ["yoom mit", "Inexteiten kön"]],
    "lengths": [[4, 5], [4, 5], [0, 0], [4, 5]],
    "scores": [[-13.67429256439209, -16.21990966796875], [-13.67429256439209, -16.21990966796875],
               [0.0, 0.0], [-13.67429256439209, -16.21990966796875]],
}
BEAM_1 = {
    "translation": ["yoomardlayam6abisplMLeichen", "yoomardlayam6abisplMLeichen", "",
                    "yoomardlayam6abisplMLeichen"],
    "length": [11, 12, 0, 11],
    "score": [-28.111928939819336, -29.045162200927734, 0.0, -28.111928939819336],
}


def _scripted_step(model):
    decode_step = model.decode_step

    def step_fn(ids, step, cache):
        _, cache = decode_step(ids, step, cache)[:2]
        last = ids[:, step][:, tf.newaxis]
        logits = tf.cast((tf.range(VOCAB)[tf.newaxis] * 37 + last * 11 + step * 5) % VOCAB,
                         tf.float32) * 0.01
        eos = tf.cast(tf.logical_and((last + step) % 7 == 6, step >= 3), tf.float32) * 6.0
        logits = tf.concat([logits[:, :3], tf.maximum(logits[:, 3:4], eos), logits[:, 4:]], 1)
        return logits, cache

    return step_fn


def _outputs(tokenizer, beam, nbest):
    # Keras draws initializer seeds from Python's and NumPy's generators (never
    # tf.random.set_seed: it clears the SentencePiece resources of other tests).
    random.seed(0)
    np.random.seed(0)
    model = build_model(ModelConfig(vocab_size=VOCAB, num_layers=1, d_model=16, d_ff=32,
                                    num_heads=2, dropout=0.0))
    translator = Translator(model, tokenizer, DecodeConfig(beam_size=beam, nbest=nbest,
                                                           extra_length=3),
                            max_source_length=64, decode_step=_scripted_step(model))
    texts = tf.constant(TEXTS)
    result = translator.translate_nbest(texts) if nbest > 1 else translator.translate(texts)
    return {k: v.numpy() for k, v in result.items()}


def _strings(array):
    return np.vectorize(lambda b: b.decode("utf-8"))(array).tolist()


@pytest.mark.parametrize("beam,nbest,expected", [(4, 2, BEAM_4_NBEST_2), (1, 1, BEAM_1)],
                         ids=["beam4_nbest2", "greedy"])
def test_default_outputs_equal_the_recorded_ones(small_tokenizer, beam, nbest, expected):
    got = _outputs(small_tokenizer, beam, nbest)
    assert set(got) == set(expected)
    for name, values in expected.items():
        if name.startswith("translation"):
            assert _strings(got[name]) == values, name
        elif name.startswith("length"):
            assert got[name].tolist() == values, name
        else:
            np.testing.assert_allclose(got[name], values, rtol=1e-5, err_msg=name)
