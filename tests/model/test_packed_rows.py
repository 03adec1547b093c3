"""Packed rows through the model: each pair computes as if it were alone (dropout off)."""

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.config import BOS_ID, EOS_ID, ModelConfig
from tf_transformer.inputs import packing
from tf_transformer.model import build_model
from tf_transformer.training import losses

TINY = ModelConfig(vocab_size=40, num_layers=2, d_model=32, d_ff=64, num_heads=4, dropout=0.0)
ROW = 24  # row length, both sides


def _pairs(seed=0, lengths=((5, 4), (3, 6), (7, 2), (2, 5))):
    """Pairs as the pipeline builds them: source x+[EOS], target_in [BOS]+y, target_out y+[EOS]."""
    rng = np.random.default_rng(seed)
    pairs = []
    for ls, lt in lengths:
        x = list(rng.integers(4, 40, size=ls - 1)) + [EOS_ID]
        y = list(rng.integers(4, 40, size=lt - 1))
        pairs.append((x, [BOS_ID] + y, y + [EOS_ID]))
    return pairs


def _pack(pairs, length=ROW):
    ragged = {k: tf.ragged.constant([p[i] for p in pairs], tf.int32)
              for i, k in enumerate(("source", "target_in", "target_out"))}
    return packing.pack_pairs(ragged, length, length)


def _model(overrides):
    return build_model(ModelConfig(**{**TINY.__dict__, **overrides}))


def _alone(model, pairs):
    """Per pair, the logits [T, vocab] and token losses [T] of the pair alone, padded to the
    row: one pass over the pairs as rows of a batch (rows never see each other)."""
    x, t_in, t_out = (tf.constant([v + [0] * (ROW - len(v)) for v in side], tf.int32)
                      for side in zip(*pairs))
    logits = model({"source": x, "target_in": t_in}, training=False)
    loss, _ = losses.smoothed_cross_entropy(logits, t_out, 0.1)
    return [(logits[i, :len(pair[2])].numpy(), loss[i].numpy()) for i, pair in enumerate(pairs)]


CASES = [{}, {"pre_norm": True}, {"positions": "learned"},
         {"share_embeddings": False, "source_vocab_size": 50}]


@pytest.mark.parametrize("overrides", CASES)
def test_packed_row_equals_each_pair_alone(overrides):
    model = _model(overrides)
    pairs = _pairs()
    packed = _pack(pairs)
    assert packed["source"].shape[0] == 1  # all four pairs share one row
    logits = model(packed, training=False)
    loss, weights = losses.smoothed_cross_entropy(logits, packed["target_out"], 0.1)
    segments = packed["target_segments"][0].numpy()
    for i, (alone_logits, alone_loss) in enumerate(_alone(model, pairs), start=1):
        np.testing.assert_allclose(logits[0].numpy()[segments == i], alone_logits, atol=2e-5)
        np.testing.assert_allclose(loss[0].numpy()[segments == i].sum(), alone_loss.sum(),
                                   rtol=1e-5)
    # Padding carries zero loss weight and zero loss.
    assert (weights[0].numpy()[segments == 0] == 0).all() and (segments == 0).any()
    assert (loss[0].numpy()[segments == 0] == 0).all()
    assert weights.numpy().sum() == sum(len(p[2]) for p in pairs)


def test_packed_gradients_equal_the_sum_over_pairs_alone():
    model = _model({})
    pairs = _pairs(seed=3)
    packed = _pack(pairs)

    def grads(inputs, labels):
        with tf.GradientTape() as tape:
            loss, _ = losses.smoothed_cross_entropy(model(inputs, training=True), labels, 0.1)
            total = tf.reduce_sum(loss)
        return tape.gradient(total, model.trainable_variables)

    packed_grads = grads(packed, packed["target_out"])
    alone = [grads({"source": tf.constant([p[0]]), "target_in": tf.constant([p[1]])},
                   tf.constant([p[2]])) for p in pairs]
    for variable, g, parts in zip(model.trainable_variables, packed_grads, zip(*alone)):
        expected = sum(tf.convert_to_tensor(p) for p in parts)
        np.testing.assert_allclose(tf.convert_to_tensor(g).numpy(), expected.numpy(),
                                   atol=2e-5, err_msg=variable.path)


def test_a_later_pair_does_not_change_an_earlier_one_nor_the_reverse():
    model = _model({})
    pairs = _pairs()
    logits = model(_pack(pairs), training=False).numpy()[0]
    segments = _pack(pairs)["target_segments"][0].numpy()
    changed = list(pairs)
    rng = np.random.default_rng(7)
    x, t_in, t_out = pairs[2]
    changed[2] = ([int(v) for v in rng.integers(4, 40, size=len(x))], t_in[:1] +
                  [int(v) for v in rng.integers(4, 40, size=len(t_in) - 1)], t_out)
    other = model(_pack(changed), training=False).numpy()[0]
    for i in (1, 2, 4):  # earlier and later pairs untouched
        np.testing.assert_allclose(other[segments == i], logits[segments == i], atol=1e-5)
    assert np.abs(other[segments == 3] - logits[segments == 3]).max() > 1e-3


def test_causal_within_a_packed_pair():
    model = _model({})
    pairs = _pairs()
    packed = _pack(pairs)
    logits = model(packed, training=False).numpy()[0]
    segments = packed["target_segments"][0].numpy()
    start = int(np.argmax(segments == 2))
    cuts = range(1, len(pairs[1][1]))  # change pair 2's tokens from `cut` on
    spans = [slice(start + cut, start + len(pairs[1][1])) for cut in cuts]
    target_in = np.repeat(packed["target_in"].numpy(), len(cuts), axis=0)
    for row, (cut, span) in enumerate(zip(cuts, spans)):
        target_in[row, span] = np.random.default_rng(cut).integers(4, 40,
                                                                   size=span.stop - span.start)
    # Every changed row in one pass, stacked on the batch axis (rows never see each other).
    batch = {k: tf.repeat(v, len(cuts), axis=0) for k, v in packed.items()}
    others = model({**batch, "target_in": tf.constant(target_in)}, training=False).numpy()
    for cut, span, other in zip(cuts, spans, others):
        np.testing.assert_allclose(other[:start + cut], logits[:start + cut], atol=1e-5)
        np.testing.assert_allclose(other[segments > 2], logits[segments > 2], atol=1e-5)
        assert np.abs(other[span] - logits[span]).max() > 1e-3


def test_positions_default_to_those_of_the_segments():
    model = _model({})
    packed = _pack(_pairs())
    without = {k: v for k, v in packed.items() if not k.endswith("_positions")}
    real = packed["target_segments"].numpy() > 0  # padding outputs are never used
    np.testing.assert_allclose(model(without, training=False).numpy()[real],
                               model(packed, training=False).numpy()[real], atol=1e-6)
    # ... and wrong positions do change the output (they are used).
    shifted = {**packed, "target_positions": packed["target_positions"] + 1}
    assert np.abs(model(shifted, training=False).numpy()
                  - model(packed, training=False).numpy()).max() > 1e-3


def test_segments_of_one_side_only_are_refused():
    model = _model({})
    packed = _pack(_pairs())
    with pytest.raises(ValueError, match="both"):
        model.states({k: v for k, v in packed.items() if k != "source_segments"})


def test_trainer_grads_on_a_packed_row_equal_the_pairs_alone(tmp_path):
    """The trainer hands the segment and position ids to the model (training/step.py)."""
    from tf_transformer.config import Config, DataConfig
    from tf_transformer.training.trainer import Trainer

    config = Config(model=TINY, data=DataConfig(max_length=ROW, tokens_per_batch=2 * ROW))
    trainer = Trainer(config, str(tmp_path), tf.distribute.OneDeviceStrategy("/cpu:0"))
    pairs = _pairs(seed=4)
    grads, loss, tokens, source_tokens = trainer.train_step.grads(_pack(pairs))
    alone = [trainer.train_step.grads({k: tf.constant([p[i]]) for i, k in
                             enumerate(("source", "target_in", "target_out"))}) for p in pairs]
    assert float(tokens) == sum(float(a[2]) for a in alone) == sum(len(p[2]) for p in pairs)
    assert float(source_tokens) == sum(len(p[0]) for p in pairs)
    np.testing.assert_allclose(float(loss), sum(float(a[1]) for a in alone), rtol=1e-5)
    for g, parts in zip(grads, zip(*(a[0] for a in alone))):
        np.testing.assert_allclose(g.numpy(), sum(p.numpy() for p in parts), atol=2e-5)
