"""divergence.py: the unigram level of the smoothed loss, and the warning it drives.

The level is checked against the trainer's own loss function (a constant
prediction equal to the smoothed unigram distribution costs exactly that much,
any other costs more); the watch on scripted loss curves; and end to end, a
tiny model that cannot learn (learning rate 0, or one so high it collapses)
gets the warning in its log and TensorBoard, one that learns does not.
"""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
from model_fixtures import MAX_CHARS, TRAIN_TSV, tiny_config
from trainer_fixtures import dataset_of, read_scalars

from tf_transformer.inputs import corpus, pipeline
from tf_transformer.model_dir import ModelDir
from tf_transformer.training import divergence, losses
from tf_transformer.training.divergence import DivergenceWatch
from tf_transformer.training.trainer import Trainer


def _constant_loss(log_probs, labels, eps):
    logits = tf.tile(tf.constant(log_probs, tf.float32)[None], [len(labels), 1])
    loss, _ = losses.smoothed_cross_entropy(logits, tf.constant(labels), eps)
    return float(tf.reduce_mean(loss))


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_unigram_level_is_the_least_loss_of_a_constant_prediction(eps):
    counts = np.array([0, 0, 0, 5, 40, 20, 10, 3, 1, 1])  # PAD..EOS reserved, EOS counted
    labels = np.repeat(np.arange(len(counts)), counts).astype(np.int32)
    level = divergence.unigram_loss(counts, eps)
    p = counts / counts.sum()
    q = (1 - eps) * p + eps * (1 - p) / (len(p) - 1)
    assert _constant_loss(np.log(np.maximum(q, 1e-30)), labels, eps) == pytest.approx(level,
                                                                                    rel=1e-5)
    rng = np.random.default_rng(0)
    for _ in range(5):  # any other constant prediction costs more
        other = np.log(np.maximum(q, 1e-30)) + rng.normal(scale=0.3, size=len(q))
        other -= np.log(np.exp(other).sum())
        assert _constant_loss(other, labels, eps) > level
    assert divergence.unigram_loss(np.ones(8), 0.0) == pytest.approx(np.log(8))


def test_target_counts_count_pieces_and_one_eos_per_sentence(small_tokenizer):
    sentences = ["Fonts", "Replacement table"]
    counts = divergence.target_counts(sentences, small_tokenizer, small_tokenizer.vocab_size)
    pieces = small_tokenizer.tokenize(tf.constant(sentences)).flat_values.numpy()
    assert counts.sum() == len(pieces) + 2 and counts[3] == 2
    assert counts.shape == (small_tokenizer.vocab_size,)


def _feed(watch, losses_by_step):
    return [(step, line) for step, loss in enumerate(losses_by_step, 1)
            if (line := watch.update(step, loss))]


def test_watch_warns_on_a_flat_loss_at_or_above_the_level_only():
    rng = np.random.default_rng(0)
    noise = rng.normal(scale=0.05, size=100)
    flat_at = _feed(DivergenceWatch(5.0, window=20), 5.02 + noise)
    assert [step for step, _ in flat_at] == [20, 40, 60, 80, 100]  # once per window
    assert "diverged? loss " in flat_at[0][1] and "at the unigram level 5.000" in \
        flat_at[0][1] and "for 20 steps" in flat_at[0][1]
    assert "above the unigram level" in _feed(DivergenceWatch(5.0, 20), 6.5 + noise)[0][1]
    assert not _feed(DivergenceWatch(5.0, 20), 4.5 + noise)  # below: learning
    assert not _feed(DivergenceWatch(5.0, 20), np.linspace(7.0, 5.0, 100))  # still falling
    late = _feed(DivergenceWatch(5.0, 20, first_step=50), 5.0 + noise)
    assert [step for step, _ in late] == [70, 90]  # warmup steps are not counted
    watch = DivergenceWatch(5.0, 20)
    _feed(watch, 5.0 + noise)
    assert watch.warnings == 5


@pytest.fixture(scope="module")
def pairs():
    """16 short pairs: a tiny model memorises them (loss far below the unigram level)."""
    pairs = corpus.read_tsv(TRAIN_TSV, max_chars=MAX_CHARS)
    return corpus.Corpus(pairs.sources[:16], pairs.targets[:16])


WARMUP, WINDOW, STEPS = 20, 30, 60


def _config(tokenizer, scale=1.0):
    # One layer each side: half the step's tracing, and it still memorises the pairs.
    config = tiny_config(tokenizer.vocab_size, num_layers=1)
    return config.replace(
        train=dataclasses.replace(config.train, learning_rate_scale=scale, warmup_steps=WARMUP,
                                  divergence_steps=WINDOW, log_every=10),
        data=dataclasses.replace(config.data, tokens_per_batch=512, deterministic=True))


@pytest.fixture(scope="module")
def batches(pairs, small_tokenizer):
    """The pipeline's first STEPS batches of the pairs and their unigram level, made once for
    the three runs below (each pipeline's tracing costs a second or two), which repeat them."""
    config = _config(small_tokenizer)
    dataset = pipeline.make_dataset(pairs, small_tokenizer, config.data, training=True)
    unigram = divergence.corpus_unigram_loss(pairs, small_tokenizer,
                                             config.train.label_smoothing)
    return list(dataset.take(STEPS).as_numpy_iterator()), unigram


def _train(tmp_path, batches, tokenizer, scale):
    config = _config(tokenizer, scale)
    model_dir = str(tmp_path / f"scale{scale}")
    ModelDir(model_dir).prepare(config, tokenizer.model_proto)
    batches, unigram = batches
    lines = []
    Trainer(config, model_dir, tf.distribute.OneDeviceStrategy("/cpu:0")).train(
        dataset_of(batches), max_steps=STEPS, log_fn=lines.append, unigram_loss=unigram)
    warnings = [line for line in lines if "diverged?" in line]
    return warnings, read_scalars(f"{model_dir}/train"), unigram


@pytest.mark.parametrize("scale", [0.0, pytest.param(8.0, marks=pytest.mark.slow)])
def test_a_model_that_cannot_learn_is_reported(tmp_path, batches, small_tokenizer, scale):
    """Learning rate 0 (loss flat above the level) and 16x the rate that learns (the
    loss collapses onto the level)."""
    warnings, scalars, unigram = _train(tmp_path, batches, small_tokenizer, scale)
    assert warnings and warnings[0].startswith("warning: diverged? loss ")
    assert f"unigram level {unigram:.3f} for {WINDOW} steps" in warnings[0]
    assert scalars["divergence_warnings"][STEPS] == len(warnings)
    assert scalars["unigram_loss"][STEPS] == pytest.approx(unigram, rel=1e-6)


def test_a_model_that_learns_is_not_reported(tmp_path, batches, small_tokenizer):
    warnings, scalars, unigram = _train(tmp_path, batches, small_tokenizer, 0.5)
    assert not warnings
    assert scalars["divergence_warnings"][STEPS] == 0
    assert scalars["loss"][STEPS] < unigram - divergence.TOLERANCE
