"""Label smoothing, the schedule, and a tiny model overfitting a few pairs."""

import math
import random

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.config import BOS_ID, EOS_ID, PAD_ID, ModelConfig, TrainConfig
from tf_transformer.model import build_model
from tf_transformer.training import losses, schedule


def gathered_cross_entropy(logits, labels, label_smoothing: float):
    """The loss before the fused version: the gold log-probability gathered from a
    log-softmax (its gradient is a dense UnsortedSegmentSum). Same contract as
    losses.smoothed_cross_entropy; kept as the reference its tests compare with."""
    logits = tf.cast(logits, tf.float32)
    vocab = tf.shape(logits)[-1]
    confidence = 1.0 - label_smoothing
    low = label_smoothing / tf.cast(vocab - 1, tf.float32)
    log_probs = tf.nn.log_softmax(logits)
    target_log_prob = tf.gather(log_probs, labels, axis=-1, batch_dims=len(labels.shape))
    sum_log_probs = tf.reduce_sum(log_probs, axis=-1)
    loss = -(confidence * target_log_prob + low * (sum_log_probs - target_log_prob))
    weights = tf.cast(tf.not_equal(labels, PAD_ID), tf.float32)
    return loss * weights, weights


LOSSES = pytest.mark.parametrize(
    "loss_fn", [losses.smoothed_cross_entropy, losses.compiled_smoothed_cross_entropy],
    ids=["kernel", "compiled"])


@LOSSES
def test_label_smoothing_equals_hand_computation(loss_fn):
    logits = tf.constant([[[2.0, 1.0, 0.0, -1.0], [0.5, 0.5, 0.5, 0.5]]])
    labels = tf.constant([[1, 0]])  # the second position is padding
    loss, weights = loss_fn(logits, labels, 0.1)
    p = np.exp([2.0, 1.0, 0.0, -1.0]) / np.exp([2.0, 1.0, 0.0, -1.0]).sum()
    target = np.array([0.1 / 3, 0.9, 0.1 / 3, 0.1 / 3])
    expected = -(target * np.log(p)).sum()
    np.testing.assert_allclose(loss.numpy()[0, 0], expected, rtol=1e-6)
    assert loss.numpy()[0, 1] == 0.0 and weights.numpy().tolist() == [[1.0, 0.0]]
    np.testing.assert_allclose(losses.mean_token_loss(logits, labels, 0.1).numpy(), expected,
                               rtol=1e-6)


def _loss_and_grad(loss_fn, logits, labels, eps):
    with tf.GradientTape() as tape:
        tape.watch(logits)
        loss, weights = loss_fn(logits, labels, eps)
        upstream = tf.reshape(tf.range(1.0, 1.0 + tf.size(loss, tf.float32)), tf.shape(loss))
        total = tf.reduce_sum(loss * upstream)
    return loss, weights, tape.gradient(total, logits)


@LOSSES
@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_fused_loss_equals_gathered_loss(eps, dtype, loss_fn):
    """The fused kernel (evaluation) and the compiled loss (training) against the gather
    formula the first replaced: values, weights and gradients (a non-uniform upstream
    gradient), PAD labels and PAD as a gold-less column included, in the compute dtypes
    of mixed precision."""
    rng = np.random.default_rng(int(eps * 10))
    logits = tf.cast(tf.constant(rng.normal(scale=4.0, size=(3, 7, 50)), tf.float32), dtype)
    labels = rng.integers(0, 50, size=(3, 7))
    labels[:, -2:] = PAD_ID
    labels = tf.constant(labels, tf.int32)
    fused = _loss_and_grad(loss_fn, logits, labels, eps)
    gathered = _loss_and_grad(gathered_cross_entropy, logits, labels, eps)
    assert fused[0].dtype == tf.float32 and fused[2].dtype == logits.dtype
    np.testing.assert_allclose(fused[0].numpy(), gathered[0].numpy(), rtol=2e-6, atol=2e-6)
    np.testing.assert_array_equal(fused[1].numpy(), gathered[1].numpy())
    grad_tol = 1e-6 if dtype == "float32" else 1e-2  # the cast back rounds each gradient
    np.testing.assert_allclose(tf.cast(fused[2], tf.float32).numpy(),
                               tf.cast(gathered[2], tf.float32).numpy(), rtol=grad_tol,
                               atol=grad_tol * 60)
    assert not np.any(tf.cast(fused[2], tf.float32).numpy()[:, -2:])  # PAD rows: no gradient


@LOSSES
def test_fused_loss_compiles_with_xla(loss_fn):
    """--jit_compile keeps every position: the loss must compile, same values."""
    rng = np.random.default_rng(3)
    logits = tf.constant(rng.normal(size=(2, 5, 30)), tf.float32)
    labels = tf.constant(rng.integers(0, 30, size=(2, 5)), tf.int32)
    graph = _loss_and_grad(loss_fn, logits, labels, 0.1)
    compiled = tf.function(_loss_and_grad, autograph=False, jit_compile=True)(
        loss_fn, logits, labels, 0.1)
    for a, b in zip(graph, compiled):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


def test_fused_loss_has_no_gather_gradient():
    """The backward pass of the loss is the fused kernel's own gradient: no dense
    UnsortedSegmentSum over [tokens, vocab], no log-softmax recomputed."""
    logits = tf.zeros([6, 10])
    labels = tf.constant([1, 2, 3, 0, 5, 6])

    @tf.function(autograph=False)
    def grad(logits):
        with tf.GradientTape() as tape:
            tape.watch(logits)
            loss = tf.reduce_sum(losses.smoothed_cross_entropy(logits, labels, 0.1)[0])
        return tape.gradient(loss, logits)

    graph = grad.get_concrete_function(logits).graph
    live, stack = set(), [t.op for t in graph.outputs]  # what the gradient depends on
    while stack:
        op = stack.pop()
        if op not in live:
            live.add(op)
            stack.extend(t.op for t in op.inputs)
    types = {op.type for op in live}
    full_size = {op.type for op in live if any(o.shape == [6, 10] for o in op.outputs)}
    assert "SoftmaxCrossEntropyWithLogits" in types
    assert not types & {"UnsortedSegmentSum", "GatherV2", "LogSoftmax", "Softmax"}, types
    assert full_size <= {"Placeholder", "OneHot", "StopGradient", "Reshape",
                         "SoftmaxCrossEntropyWithLogits", "Mul", "Identity"}, full_size


def test_loss_floor_is_entropy_of_smoothed_target():
    target = np.array([0.9] + [0.1 / 9] * 9)
    assert math.isclose(losses.loss_floor(10, 0.1), -(target * np.log(target)).sum())
    assert losses.loss_floor(10, 0.0) == 0.0


def _paper_lrate(step_num, d_model, warmup_steps):
    """Section 5.3, step_num counting updates from 1:
    lrate = d_model^-0.5 * min(step_num^-0.5, step_num * warmup_steps^-1.5)."""
    return d_model ** -0.5 * min(step_num ** -0.5, step_num * warmup_steps ** -1.5)


def _rates_used(optimizer, updates):
    """The learning rate `optimizer` uses at each of its first `updates` updates, measured.

    A scalar gets the gradient 1 at every update, from 0 each time. With a constant
    gradient g Adam's bias-corrected moments are exactly g and g^2, so the update moves
    the scalar by lrate * g / (|g| + epsilon): the rate, to 1e-9 relative. Each rate is
    also checked against `optimizer.learning_rate` read just before its update (the
    rate the trainer logs for the next step)."""
    variable = keras.Variable(0.0)
    optimizer.build([variable])

    @tf.function  # autograph: the loop over tf.range is a tf.while_loop
    def run():
        used = tf.TensorArray(tf.float32, size=updates)
        reported = tf.TensorArray(tf.float32, size=updates)
        for i in tf.range(updates):
            reported = reported.write(i, optimizer.learning_rate)
            variable.assign(0.0)
            optimizer.apply_gradients([(tf.constant(1.0), variable)])
            used = used.write(i, -variable.value)
        return used.stack(), reported.stack()

    used, reported = (t.numpy().astype(np.float64) for t in run())
    np.testing.assert_allclose(reported, used, rtol=1e-5)
    return used


@pytest.mark.parametrize("d_model, warmup_steps", [(512, 4000), (128, 40)])
def test_the_optimizer_updates_at_the_papers_rate(d_model, warmup_steps):
    """make_optimizer's Adam, updated 3 * warmup_steps times: the k-th update uses the
    paper's lrate at step_num = k, from the first (non-zero) to past the peak."""
    optimizer = schedule.make_optimizer(TrainConfig(warmup_steps=warmup_steps), d_model)
    rates = _rates_used(optimizer, 3 * warmup_steps)
    steps = np.arange(1, len(rates) + 1)
    paper = np.array([_paper_lrate(k, d_model, warmup_steps) for k in steps])
    np.testing.assert_allclose(rates, paper, rtol=1e-5)
    # The first update: d_model^-0.5 * warmup_steps^-1.5.
    assert rates[0] == pytest.approx(d_model ** -0.5 * warmup_steps ** -1.5, rel=1e-5)
    # Linear up to warmup_steps, the peak d_model^-0.5 * warmup_steps^-0.5 there,
    # then proportional to step_num^-0.5.
    assert np.argmax(rates) + 1 == warmup_steps
    assert rates[warmup_steps - 1] == pytest.approx((d_model * warmup_steps) ** -0.5, rel=1e-5)
    rising, falling = slice(0, warmup_steps), slice(warmup_steps - 1, None)
    np.testing.assert_allclose(rates[rising] / steps[rising], rates[0], rtol=1e-5)
    np.testing.assert_allclose(rates[falling] * np.sqrt(steps[falling]),
                               rates[warmup_steps - 1] * np.sqrt(warmup_steps), rtol=1e-5)


@pytest.mark.parametrize("step_num", [1, 2, 1000, 4000, 4001, 10000, 100000])
def test_the_rate_after_a_restore_is_the_papers(step_num):
    """After step_num - 1 updates (a checkpoint restored there), the rate of the next
    update is the paper's at step_num, far past what test_the_optimizer_updates_at_the_
    papers_rate runs."""
    optimizer = schedule.make_optimizer(TrainConfig(), 512)
    optimizer.iterations.assign(step_num - 1)
    assert float(optimizer.learning_rate) == pytest.approx(_paper_lrate(step_num, 512, 4000),
                                                           rel=1e-6)


def test_the_rate_scale_multiplies_every_update():
    plain = _rates_used(schedule.make_optimizer(TrainConfig(warmup_steps=10), 64), 20)
    scaled = _rates_used(
        schedule.make_optimizer(TrainConfig(warmup_steps=10, learning_rate_scale=2.0), 64), 20)
    np.testing.assert_allclose(scaled, 2 * plain, rtol=1e-6)


def test_optimizer_is_the_papers_adam():
    opt = schedule.make_optimizer(TrainConfig(), 512)
    assert (opt.beta_1, opt.beta_2, opt.epsilon) == (0.9, 0.98, 1e-9)


def test_tiny_model_overfits_a_few_pairs():
    config = ModelConfig(vocab_size=24, num_layers=1, d_model=32, d_ff=64, num_heads=4,
                         dropout=0.0)
    # Seeded weights (Keras draws initializer seeds from Python's and NumPy's generators):
    # unseeded, the outcome hung on whatever the process had drawn before (0.77 once).
    random.seed(0)
    np.random.seed(0)
    model = build_model(config)
    rng = np.random.default_rng(0)
    sources = rng.integers(4, 24, size=(4, 6))
    ys = rng.integers(4, 24, size=(4, 5))
    target_in = np.concatenate([np.full((4, 1), BOS_ID), ys], 1)
    target_out = np.concatenate([ys, np.full((4, 1), EOS_ID)], 1)
    inputs = {"source": tf.constant(sources, tf.int32), "target_in": tf.constant(target_in, tf.int32)}
    labels = tf.constant(target_out, tf.int32)
    optimizer = tf.keras.optimizers.Adam(3e-3)

    def step(i, loss):
        with tf.GradientTape() as tape:
            loss = losses.mean_token_loss(model(inputs, training=True), labels, 0.1)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return i + 1, loss

    # Without autograph, which would convert every layer's call while tracing (seconds).
    @tf.function(autograph=False)
    def train(steps):
        """`steps` Adam steps in one call (a tf.while_loop); the last step's loss."""
        return tf.while_loop(lambda i, loss: i < steps, step,
                             (tf.constant(0), tf.constant(0.0)))[1]

    # 100 steps: within 0.02 of the floor from the weights of seeds 0 to 3 (0.017 at worst).
    loss = train(tf.constant(100))
    assert int(optimizer.iterations) == 100
    floor = losses.loss_floor(24, 0.1)
    assert float(loss) < floor + 0.05, (float(loss), floor)
