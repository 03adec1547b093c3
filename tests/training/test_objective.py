"""Label smoothing, the schedule, and a tiny model overfitting a few pairs."""

import math

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.config import BOS_ID, EOS_ID, ModelConfig, TrainConfig
from tf_transformer.model import build_model
from tf_transformer.training import losses, schedule


def test_label_smoothing_equals_hand_computation():
    logits = tf.constant([[[2.0, 1.0, 0.0, -1.0], [0.5, 0.5, 0.5, 0.5]]])
    labels = tf.constant([[1, 0]])  # the second position is padding
    loss, weights = losses.smoothed_cross_entropy(logits, labels, 0.1)
    p = np.exp([2.0, 1.0, 0.0, -1.0]) / np.exp([2.0, 1.0, 0.0, -1.0]).sum()
    target = np.array([0.1 / 3, 0.9, 0.1 / 3, 0.1 / 3])
    expected = -(target * np.log(p)).sum()
    np.testing.assert_allclose(loss.numpy()[0, 0], expected, rtol=1e-6)
    assert loss.numpy()[0, 1] == 0.0 and weights.numpy().tolist() == [[1.0, 0.0]]
    np.testing.assert_allclose(losses.mean_token_loss(logits, labels, 0.1).numpy(), expected,
                               rtol=1e-6)


def test_loss_floor_is_entropy_of_smoothed_target():
    target = np.array([0.9] + [0.1 / 9] * 9)
    assert math.isclose(losses.loss_floor(10, 0.1), -(target * np.log(target)).sum())
    assert losses.loss_floor(10, 0.0) == 0.0


@pytest.mark.parametrize("step", [0, 1, 999, 3999, 4000, 10000, 100000])
def test_schedule_equals_formula(step):
    lr = schedule.WarmupInverseSqrt(512, 4000)(step).numpy()
    s = step + 1
    assert math.isclose(lr, 512 ** -0.5 * min(s ** -0.5, s * 4000 ** -1.5), rel_tol=1e-6)


def test_schedule_peaks_at_warmup():
    sched = schedule.WarmupInverseSqrt(512, 4000)
    values = [sched(s).numpy() for s in (3000, 3999, 5000)]
    assert values[1] > values[0] and values[1] > values[2]


def test_optimizer_is_the_papers_adam():
    opt = schedule.make_optimizer(TrainConfig(), 512)
    assert (opt.beta_1, opt.beta_2, opt.epsilon) == (0.9, 0.98, 1e-9)


def test_tiny_model_overfits_a_few_pairs():
    config = ModelConfig(vocab_size=24, num_layers=1, d_model=32, d_ff=64, num_heads=4,
                         dropout=0.0)
    model = build_model(config)
    rng = np.random.default_rng(0)
    sources = rng.integers(4, 24, size=(4, 6))
    ys = rng.integers(4, 24, size=(4, 5))
    target_in = np.concatenate([np.full((4, 1), BOS_ID), ys], 1)
    target_out = np.concatenate([ys, np.full((4, 1), EOS_ID)], 1)
    inputs = {"source": tf.constant(sources, tf.int32), "target_in": tf.constant(target_in, tf.int32)}
    labels = tf.constant(target_out, tf.int32)
    optimizer = tf.keras.optimizers.Adam(3e-3)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = losses.mean_token_loss(model(inputs, training=True), labels, 0.1)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    for _ in range(300):
        loss = step()
    floor = losses.loss_floor(24, 0.1)
    assert float(loss) < floor + 0.05, (float(loss), floor)
