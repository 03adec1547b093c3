"""Static batches (DataConfig.static_batch): a few fixed shapes, every pair once,
filler rows all PAD; and the boundary choice."""

import itertools

import numpy as np

from tf_transformer.config import PAD_ID, DataConfig
from tf_transformer.inputs import corpus, pipeline

CONFIG = DataConfig(max_length=48, tokens_per_batch=512, static_batch=True,
                    static_boundaries=(8, 16, 24, 64), deterministic=True)


def test_boundaries_end_at_max_length_and_drop_longer_ones():
    assert pipeline.static_bucket_boundaries(CONFIG) == [8, 16, 24, 48]
    assert DataConfig(static_boundaries=[8, 16]).static_boundaries == (8, 16)  # from JSON


def test_an_epoch_holds_every_pair_once_in_the_static_shapes(embedded_corpus, small_tokenizer):
    pairs = corpus.Corpus(embedded_corpus.sources[:700], embedded_corpus.targets[:700])
    batches = list(pipeline.make_dataset(pairs, small_tokenizer, CONFIG, training=True,
                                         repeat=False, count_skipped=False).as_numpy_iterator())
    allowed = {(512 // n, n) for n in (8, 16, 24, 48)}
    shapes = {b[k].shape for b in batches for k in pipeline.KEYS}
    assert shapes <= allowed and len(shapes) == len(allowed)
    real = 0
    for batch in batches:
        filler = batch["target_out"].max(axis=1) == PAD_ID
        real += int(np.sum(~filler))
        for k in pipeline.KEYS:  # a filler row is all PAD, so it weighs 0 in the loss
            assert not batch[k][filler].any()
    plain = pipeline.make_dataset(pairs, small_tokenizer, DataConfig(max_length=48), training=True,
                                  repeat=False, count_skipped=False)
    assert real == sum(len(b["source"]) for b in plain.as_numpy_iterator())
    # A finite epoch ends each bucket with a short batch: filled, not a new shape.
    assert any((b["target_out"].max(axis=1) == PAD_ID).any() for b in batches)


def test_evaluation_batches_are_not_filled(embedded_corpus, small_tokenizer):
    pairs = corpus.Corpus(embedded_corpus.sources[:100], embedded_corpus.targets[:100])
    batches = list(pipeline.make_dataset(pairs, small_tokenizer, CONFIG,
                                         training=False).as_numpy_iterator())
    assert sorted(np.concatenate([b["index"] for b in batches])) == list(range(100))


def test_best_boundaries_is_the_brute_force_optimum():
    rng = np.random.default_rng(0)
    lengths = np.minimum(rng.geometric(0.08, size=3000) + 1, 40)
    cands = list(range(4, 40, 4))
    for count in (1, 2, 3, 4):
        best = min(([*c, 40] for c in itertools.combinations(cands, count - 1)),
                   key=lambda b: pipeline.padded_positions(b, lengths, 160))
        got = pipeline.best_boundaries(lengths, count, 40, 160, multiple=4)
        assert len(got) == count and got[-1] == 40
        np.testing.assert_allclose(pipeline.padded_positions(got, lengths, 160),
                                   pipeline.padded_positions(best, lengths, 160))
