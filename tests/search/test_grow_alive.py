"""A step's k best extensions are the k best of the whole [beam * vocab] log-softmax with
PAD, BOS and never_ids masked: values, parents and tokens, ties (the lower flat index
first), banned best logits, dead slots and the first step's one row per sentence included."""

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.config import PAD_ID
from tf_transformer.search import beam_step
from tf_transformer.search.state import NEG_INF, BeamState, SearchConfig, empty_results

BOS, EOS = 2, 3


def _reference(logits, alive_log_probs, beam, never):
    """The whole-row computation: log_softmax, mask, offset, one top-k."""
    vocab = logits.shape[-1]
    log_probs = tf.nn.log_softmax(logits)
    banned = np.isin(np.arange(vocab), never)
    log_probs = tf.where(banned, NEG_INF, tf.reshape(log_probs, [-1, beam, vocab]))
    candidates = alive_log_probs[:, :, None] + log_probs
    values, index = tf.math.top_k(tf.reshape(candidates, [-1, beam * vocab]), k=beam)
    return values.numpy(), (index // vocab).numpy(), (index % vocab).numpy()


def _grow(logits, alive_log_probs, beam, never_ids, first=False):
    batch = alive_log_probs.shape[0]
    width = 6
    config = SearchConfig(lambda ids, step, cache: (tf.constant(logits), cache),
                          vocab_size=logits.shape[-1], beam_size=beam, alpha=tf.constant(0.6),
                          max_lengths=tf.fill([batch], 5), eos_id=EOS, bos_id=BOS, nbest=1,
                          never_ids=never_ids)
    state = BeamState(tf.constant(1), tf.fill([batch, beam, width], PAD_ID),
                      tf.constant(alive_log_probs), {}, tf.fill([batch, beam, width], PAD_ID),
                      tf.fill([batch, beam], NEG_INF), tf.zeros([batch, beam], tf.int32),
                      tf.zeros([batch], tf.bool), tf.fill([batch], 5), tf.range(batch),
                      empty_results(batch, 1, width))
    values, ids, parents, tokens, _ = beam_step._grow_alive(config, state, first)
    assert (ids.numpy()[:, :, 2] == tokens.numpy()).all()  # the new column
    return values.numpy(), parents.numpy(), tokens.numpy()


@pytest.mark.parametrize("levels", [None, 3], ids=["distinct", "ties"])
@pytest.mark.parametrize("never_ids", [(), (5, 9)])
def test_equals_the_whole_row_top_k(levels, never_ids):
    rng = np.random.default_rng(len(never_ids) + (levels or 0))
    batch, beam, vocab = 5, 4, 300
    logits = rng.normal(size=(batch * beam, vocab))
    if levels:  # few distinct values: many ties, within and across rows
        logits = np.round(logits * levels / 3) * 3 / levels
    # The best logits of some rows are the banned tokens.
    for row, token in enumerate([PAD_ID, BOS] + list(never_ids)):
        logits[row, token] = 50.0
    logits = logits.astype(np.float32)
    alive = rng.normal(-2.0, 1.0, size=(batch, beam)).astype(np.float32)
    alive[1] = -2.5  # equal parents: ties across rows
    alive[2, 1:] = NEG_INF  # dead slots
    never = [PAD_ID, BOS, *never_ids]
    want = _reference(logits, alive, beam, never)
    got = _grow(logits, alive, beam, never_ids)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[2], want[2])
    assert not np.isin(got[2], never).any()


def test_the_first_step_extends_slot_zero_only():
    rng = np.random.default_rng(7)
    batch, beam, vocab = 3, 4, 50
    logits = rng.normal(size=(batch, vocab)).astype(np.float32)
    alive = np.tile(np.array([[0.0, NEG_INF, NEG_INF, NEG_INF]], np.float32), [batch, 1])
    tiled = np.repeat(logits, beam, axis=0)  # the reference's rows for every slot
    want = _reference(tiled, alive, beam, [PAD_ID, BOS])
    got = _grow(logits, alive, beam, (), first=True)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    assert (got[1] == 0).all()
    np.testing.assert_array_equal(got[2], want[2])


def test_a_vocabulary_barely_larger_than_the_beam():
    logits = np.array([[0.1, 2.0, 1.0, 0.5, 0.3]] * 4, np.float32)  # 3 allowed tokens, beam 4
    alive = np.array([[-1.0, -1.5, -2.0, -3.0]], np.float32)
    want = _reference(logits, alive, 4, [PAD_ID, BOS])
    got = _grow(logits, alive, 4, ())
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[2], want[2])
