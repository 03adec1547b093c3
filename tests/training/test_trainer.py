"""The trainer: replica-count invariance, accumulation, averaging, NaN guard. (Resume:
test_exact_resume.py, test_host_loop.py.)"""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf
from trainer_fixtures import (
    MODEL,
    STEPS,
    concat_batches,
    dataset_of,
    pad_batch,
    random_batch,
    read_scalars,
    train_config,
    weights_but_key_biases,
)

from tf_transformer.config import ConfigError
from tf_transformer.model import build_model
from tf_transformer import model_dir as model_dir_lib
from tf_transformer.model_dir import ModelDir
from tf_transformer.training import keras_optimizers, losses
from tf_transformer.training.host_loop import NonFiniteLossError
from tf_transformer.training.trainer import StepPolicy, Trainer


def _sgd():
    """Plain SGD (learning rate 1), pre-reduced as the trainer requires.

    The invariance tests train with it, not Adam: SGD's update is linear in the
    gradient, so gradients summed over the replicas twice (Keras's all-reduce
    not switched off) or not at all, or divided by the wrong token count, change
    the weights; Adam's update hardly changes when every gradient is scaled alike."""
    return keras_optimizers.pre_reduced(keras.optimizers.SGD)(learning_rate=1.0)


def _train(tmp_path, name, strategy, batches, steps, optimizer_fn=None, trainer=None, **train):
    trainer = trainer or Trainer(train_config(**train), str(tmp_path / name), strategy,
                                 optimizer_fn=optimizer_fn)
    losses = []
    trainer.train(dataset_of(batches), max_steps=steps,
                  log_fn=lambda line: losses.append(float(line.split("loss=")[1].split()[0])))
    return trainer, losses


@pytest.mark.parametrize("gather", [True, False], ids=["gather_cpu", "fixed_shape_gpu_xla"])
def test_output_layer_on_non_pad_positions_equals_the_full_masked_loss(tmp_path, gather):
    """On CPU the trainer skips pad positions before the softmax layer (a gather whose
    shape depends on the data); on GPU and under XLA it keeps every position (a fixed
    shape). The loss and gradients must equal those of every position with pads
    weighted 0 either way."""
    trainer = Trainer(train_config(), str(tmp_path), tf.distribute.get_strategy(),
                      step_policy=StepPolicy(gather_targets=gather))
    batch = {k: tf.constant(v) for k, v in pad_batch(random_batch(3, 4, 6), 9).items()}
    variables = trainer.model.trainable_variables
    with tf.GradientTape() as tape:
        logits = trainer.model({"source": batch["source"], "target_in": batch["target_in"]},
                               training=True)
        token_loss, weights = losses.smoothed_cross_entropy(logits, batch["target_out"], 0.1)
        full_sum = tf.reduce_sum(token_loss)
    full_grads = [tf.convert_to_tensor(g) for g in tape.gradient(full_sum, variables)]
    grads, loss_sum, tokens, _ = trainer.train_step.grads(batch)
    assert float(tokens) == float(tf.reduce_sum(weights)) < 4 * 9
    ops = {op.type for op in tf.function(trainer.train_step.loss_sums, autograph=False).get_concrete_function(
        {k: tf.TensorSpec([None, None], tf.int32) for k in batch}).graph.get_operations()}
    assert ("Where" in ops) == gather  # the data-dependent shape only where gathered
    np.testing.assert_allclose(float(loss_sum), float(full_sum), rtol=1e-6)
    for got, want in zip(grads, full_grads):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-6)


def _assert_same_training(a, b, losses_a, losses_b, initial):
    """Same losses and weights (to float32 sums in another order), after weights that moved
    far more than that tolerance (so equal weights are not the untrained ones)."""
    np.testing.assert_allclose(losses_a, losses_b, atol=2e-5)
    weights_a, weights_b = weights_but_key_biases(a), weights_but_key_biases(b)
    for x, y in zip(weights_a, weights_b):
        np.testing.assert_allclose(x, y, atol=2e-5)
    assert max(np.abs(x - w).max() for x, w in zip(weights_a, initial)) > 1e-2


@pytest.fixture(scope="module")
def global_batch(tmp_path_factory):
    """The reference of the two invariance tests below: one replica, each step's two halves
    as one batch, SGD; and the initial weights (the same seed: every trainer's)."""
    path = tmp_path_factory.mktemp("global_batch")
    one = Trainer(train_config(), str(path / "one"), tf.distribute.OneDeviceStrategy("/cpu:0"),
                  optimizer_fn=_sgd)
    initial = weights_but_key_biases(one)
    trainer, losses = _train(path, "one", None, [concat_batches(*pair) for pair in STEPS], 3,
                             trainer=one)
    return trainer, losses, initial


def test_two_replicas_equal_one_replica_with_the_global_batch(tmp_path, global_batch):
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert mirrored.num_replicas_in_sync == 2
    two, losses_two = _train(tmp_path, "two", mirrored, [b for pair in STEPS for b in pair], 3,
                             optimizer_fn=_sgd)
    assert two.strategy.num_replicas_in_sync == 2
    one, losses_one, initial = global_batch
    assert one.strategy.num_replicas_in_sync == 1
    _assert_same_training(two, one, losses_two, losses_one, initial)


def test_accumulation_equals_a_batch_twice_as_large(tmp_path, global_batch):
    device = tf.distribute.OneDeviceStrategy("/cpu:0")
    accum, losses_accum = _train(tmp_path, "accum", device, [b for pair in STEPS for b in pair],
                                 3, optimizer_fn=_sgd, accum_steps=2)
    big, losses_big, initial = global_batch
    _assert_same_training(accum, big, losses_accum, losses_big, initial)


def test_an_optimizer_that_all_reduces_again_is_refused(tmp_path):
    with pytest.raises(TypeError, match="all-reduce the gradients again"):
        Trainer(train_config(), str(tmp_path), tf.distribute.OneDeviceStrategy("/cpu:0"),
                optimizer_fn=lambda: keras.optimizers.SGD(learning_rate=1.0))


def test_nan_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(tmp_path):
    device = tf.distribute.OneDeviceStrategy("/cpu:0")
    batches = [concat_batches(*pair) for pair in STEPS]
    # An absurd learning rate: the first update sends the weights to inf.
    trainer = Trainer(train_config(learning_rate_scale=1e38, checkpoint_steps=1), str(tmp_path),
                      device)
    with pytest.raises(NonFiniteLossError, match="at step 2"):
        trainer.train(dataset_of(batches), max_steps=5, log_fn=lambda line: None)
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-1")


def test_averaging_is_the_arithmetic_mean(tmp_path):
    config = train_config()
    model_dir = str(tmp_path / "run")
    ModelDir(model_dir).prepare(config, b"vocab")
    model = build_model(config.model)
    step = tf.Variable(0, dtype=tf.int64)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model, step=step), model_dir, 5)
    values = []
    for i in range(4):
        weights = [np.full(w.shape, float(i * i), np.float32) + np.arange(w.size).reshape(w.shape)
                   for w in model.get_weights()]
        model.set_weights(weights)
        values.append(weights)
        manager.save(checkpoint_number=i)
    out = str(tmp_path / "avg")
    model_dir_lib.write_averaged(ModelDir(model_dir), 3, ModelDir(out), build_model)
    averaged = build_model(config.model)
    tf.train.Checkpoint(model=averaged).restore(tf.train.latest_checkpoint(out)).expect_partial()
    for got, *last in zip(averaged.get_weights(), *values[1:]):
        np.testing.assert_allclose(got, np.mean(last, axis=0), rtol=1e-6)
    assert ModelDir(out).read_config() == config


def test_model_dir_for_another_model_is_refused(tmp_path):
    config = train_config()
    ModelDir(str(tmp_path)).prepare(config, b"vocab-a")
    bigger = dataclasses.replace(config, model=dataclasses.replace(MODEL, d_model=32))
    with pytest.raises(ConfigError, match="different architecture"):
        ModelDir(str(tmp_path)).prepare(bigger, b"vocab-a")
    with pytest.raises(ConfigError, match="another vocabulary"):
        ModelDir(str(tmp_path)).prepare(config, b"vocab-b")


def test_tensorboard_scalars_hold_the_logged_loss_and_the_schedule(tmp_path):
    device = tf.distribute.OneDeviceStrategy("/cpu:0")
    lines = []
    trainer = Trainer(train_config(), str(tmp_path), device)
    trainer.train(dataset_of([concat_batches(*pair) for pair in STEPS]), max_steps=3,
                  log_fn=lines.append)
    scalars = read_scalars(str(tmp_path / "train"))
    logged = {int(l.split()[0][5:]): float(l.split("loss=")[1].split()[0]) for l in lines}
    assert sorted(scalars["loss"]) == [1, 2, 3] == sorted(logged)
    for step, loss in logged.items():
        assert scalars["loss"][step] == pytest.approx(loss, abs=1e-5)
        # The rate the next update uses: iterations = step, schedule counts from 1.
        assert scalars["learning_rate"][step] == pytest.approx(
            16 ** -0.5 * min((step + 1) ** -0.5, (step + 1) * 10 ** -1.5), rel=1e-5)
    assert scalars["skipped_steps"] == {1: 0.0, 2: 0.0, 3: 0.0}
    assert all(v > 0 for v in scalars["tokens_per_sec"].values())
