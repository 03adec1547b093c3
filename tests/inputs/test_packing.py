"""Packing: every pair exactly once and whole, first-fit rows, segment and position ids."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.config import BOS_ID, EOS_ID, PAD_ID, DataConfig
from tf_transformer.inputs import corpus, packing, pipeline
from tf_transformer.model import masks

KEYS = ("source", "target_in", "target_out")


def _random_pairs(n, max_len, seed):
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(n):
        x = list(rng.integers(4, 100, size=rng.integers(0, max_len))) + [EOS_ID]
        y = list(rng.integers(4, 100, size=rng.integers(0, max_len)))
        pairs.append((x, [BOS_ID] + y, y + [EOS_ID]))
    return pairs


def _ragged(pairs):
    return {k: tf.ragged.constant([p[i] for p in pairs], tf.int32) for i, k in enumerate(KEYS)}


def _unpack(packed):
    """Packed numpy rows -> list of (source, target_in, target_out) tuples, row by row."""
    out = []
    for r in range(packed["source"].shape[0]):
        src_seg, tgt_seg = packed["source_segments"][r], packed["target_segments"][r]
        for s in range(1, src_seg.max() + 1):
            out.append((tuple(packed["source"][r][src_seg == s]),
                        tuple(packed["target_in"][r][tgt_seg == s]),
                        tuple(packed["target_out"][r][tgt_seg == s])))
    return out


def _first_fit_reference(pairs, ls, lt):
    rows, used = [], []
    for x, t, _ in pairs:
        for i, (us, ut) in enumerate(used):
            if us + len(x) <= ls and ut + len(t) <= lt:
                used[i] = (us + len(x), ut + len(t))
                rows.append(i)
                break
        else:
            used.append((len(x), len(t)))
            rows.append(len(used) - 1)
    return rows


@pytest.mark.parametrize("seed,ls,lt", [(0, 16, 16), (1, 12, 20), (2, 30, 9)])
def test_every_pair_once_whole_and_first_fit(seed, ls, lt):
    pairs = _random_pairs(60, min(ls, lt) - 1, seed)
    packed = {k: v.numpy() for k, v in packing.pack_pairs(_ragged(pairs), ls, lt).items()}
    assert packed["source"].shape[1] == ls and packed["target_in"].shape[1] == lt
    assert collections.Counter(_unpack(packed)) == collections.Counter(
        tuple(map(tuple, p)) for p in pairs)
    rows = packing.first_fit(*(tf.constant([len(p[i]) for p in pairs]) for i in (0, 1)), ls, lt)
    np.testing.assert_array_equal(rows.numpy(), _first_fit_reference(pairs, ls, lt))
    assert packed["source"].shape[0] == max(_first_fit_reference(pairs, ls, lt)) + 1


def test_segment_and_position_ids():
    pairs = _random_pairs(40, 10, 5)
    packed = packing.pack_pairs(_ragged(pairs), 24, 24)
    for side, key in (("source", "source"), ("target", "target_out")):
        segments, positions = (packed[f"{side}_{n}"].numpy() for n in ("segments", "positions"))
        np.testing.assert_array_equal(segments == 0, packed[key].numpy() == PAD_ID)  # pad <=> 0
        for row_seg, row_pos in zip(segments, positions):
            real = row_seg[row_seg > 0]
            assert (np.diff(real) >= 0).all() and set(real) == set(range(1, real.max() + 1))
            for s in range(1, real.max() + 1):
                np.testing.assert_array_equal(row_pos[row_seg == s], np.arange((row_seg == s).sum()))
        # The model's own positions from segment ids agree on every real token.
        derived = masks.segment_positions(packed[f"{side}_segments"]).numpy()
        np.testing.assert_array_equal(derived[segments > 0], positions[segments > 0])


def test_each_target_segment_starts_with_bos_and_is_shifted_by_one():
    packed = {k: v.numpy() for k, v in packing.pack_pairs(
        _ragged(_random_pairs(40, 10, 6)), 24, 24).items()}
    for t_in, t_out, seg in zip(packed["target_in"], packed["target_out"],
                                packed["target_segments"]):
        for s in range(1, seg.max() + 1):
            a, b = t_in[seg == s], t_out[seg == s]
            assert a[0] == BOS_ID and b[-1] == EOS_ID and (a[1:] == b[:-1]).all()


def test_a_pair_longer_than_the_row_is_an_error_not_a_cut():
    pairs = _random_pairs(5, 6, 7) + [([5] * 10 + [EOS_ID], [BOS_ID, 5], [5, EOS_ID])]
    with pytest.raises(tf.errors.InvalidArgumentError, match="longer than the packed row"):
        packing.pack_pairs(_ragged(pairs), 8, 8)


def test_make_dataset_keeps_every_pair_of_the_bucketed_epoch(embedded_corpus, small_tokenizer):
    pairs = corpus.Corpus(embedded_corpus.sources[:1500], embedded_corpus.targets[:1500],
                          name="subset")
    config = DataConfig(max_length=48, tokens_per_batch=480, deterministic=True)
    packed = list(packing.make_dataset(pairs, small_tokenizer, config, repeat=False,
                                       count_skipped=False).as_numpy_iterator())
    bucketed = pipeline.make_dataset(pairs, small_tokenizer, config, training=True, repeat=False,
                                     count_skipped=False)
    expected = collections.Counter()
    for batch in bucketed.as_numpy_iterator():
        for row in zip(*(batch[k] for k in KEYS)):
            expected[tuple(tuple(side[side != PAD_ID]) for side in row)] += 1
    got = collections.Counter(p for batch in packed for p in _unpack(batch))
    assert got == expected and sum(got.values()) > 1000  # ~70% of pairs fit in 48
    assert {b["source"].shape for b in packed[:-1]} == {(10, 48)}  # tokens_per_batch // L rows
    pad = 1 - sum(np.count_nonzero(b["source"]) for b in packed) / sum(
        b["source"].size for b in packed)
    assert pad < 0.25  # the pairs of a row fill it (bucketing pads this corpus far more at L=48)


def test_repeating_gives_one_static_shape(embedded_corpus, small_tokenizer):
    pairs = corpus.Corpus(embedded_corpus.sources[:300], embedded_corpus.targets[:300])
    config = DataConfig(max_length=32, tokens_per_batch=256)
    dataset = packing.make_dataset(pairs, small_tokenizer, config)
    assert all(spec.shape.as_list() == [8, 32] for spec in dataset.element_spec.values())
    assert set(dataset.element_spec) == set(packing.PACKED_KEYS)
    with pytest.raises(ValueError, match="max_length"):
        packing.make_dataset(pairs, small_tokenizer, config, row_length=16)
