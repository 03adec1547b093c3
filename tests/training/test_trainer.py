"""The trainer: replica-count invariance, accumulation, resume, averaging, NaN guard."""

import dataclasses
import os

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.config import (
    BOS_ID,
    EOS_ID,
    Config,
    ConfigError,
    ModelConfig,
    TrainConfig,
)
from tf_transformer.model import build_model
from tf_transformer import model_dir as model_dir_lib
from tf_transformer.training import losses
from tf_transformer.training.trainer import NonFiniteLossError, Trainer

MODEL = ModelConfig(vocab_size=30, num_layers=1, d_model=16, d_ff=32, num_heads=2, dropout=0.0)


def _config(**train):
    return Config(model=MODEL, train=TrainConfig(**{"warmup_steps": 10, "log_every": 1,
                                                     "checkpoint_minutes": 1e9, **train}))


def _batch(seed, batch, length):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, length + 1, size=batch)
    lengths[0] = length
    source = np.zeros((batch, length), np.int32)
    target = np.zeros((batch, length), np.int32)
    for i, n in enumerate(lengths):
        source[i, :n] = rng.integers(4, 30, size=n)
        target[i, :n] = rng.integers(4, 30, size=n)
    target_in = np.concatenate([np.full((batch, 1), BOS_ID), target[:, :-1]], 1) * (target > 0)
    target_in[:, 0] = BOS_ID
    target_out = target.copy()
    target_out[np.arange(batch), lengths - 1] = EOS_ID
    return {"source": source, "target_in": target_in.astype(np.int32), "target_out": target_out}


def _pad(batch, length):
    return {k: np.pad(v, [(0, 0), (0, length - v.shape[1])]) for k, v in batch.items()}


def _concat(a, b):
    length = max(a["source"].shape[1], b["source"].shape[1])
    a, b = _pad(a, length), _pad(b, length)
    return {k: np.concatenate([a[k], b[k]]) for k in a}


def _dataset_fn(batches):
    """A repeating dataset of the given batches (tf.data can save its position)."""
    def for_start(start_step):
        assert start_step == 0  # the trainer restores the saved position
        def fn(input_context):
            del input_context
            ds = tf.data.Dataset.from_tensors(batches[0])
            for batch in batches[1:]:
                ds = ds.concatenate(tf.data.Dataset.from_tensors(batch))
            return ds.repeat()
        return fn
    return for_start


STEPS = [(_batch(2 * i, 3, 5 + i), _batch(2 * i + 1, 2, 7 - i)) for i in range(3)]


def _train(tmp_path, name, strategy, batches, steps, **train):
    trainer = Trainer(_config(**train), str(tmp_path / name), strategy)
    losses = []
    trainer.train(_dataset_fn(batches), max_steps=steps,
                  log_fn=lambda line: losses.append(float(line.split("loss=")[1].split()[0])))
    return trainer, losses


def _weights(trainer):
    """All weights but the key biases of attention: softmax is invariant to them, so
    their true gradient is exactly 0 and Adam turns rounding noise into updates."""
    weights = []
    for v in trainer.model.weights:
        value = v.numpy()
        hk = MODEL.num_heads * MODEL.key_dim
        if v.path.endswith("self_attention/qkv_bias"):
            value = np.concatenate([value[:hk], value[2 * hk:]])
        if v.path.endswith("cross_attention/key_value_bias"):
            value = value[hk:]
        weights.append(value)
    return weights


def test_output_layer_on_non_pad_positions_equals_the_full_masked_loss(tmp_path):
    """The trainer skips pad positions before the softmax layer; the loss and
    gradients must equal those of every position with pads weighted 0."""
    trainer = Trainer(_config(), str(tmp_path), tf.distribute.get_strategy())
    batch = {k: tf.constant(v) for k, v in _pad(_batch(3, 4, 6), 9).items()}
    variables = trainer.model.trainable_variables
    with tf.GradientTape() as tape:
        logits = trainer.model({"source": batch["source"], "target_in": batch["target_in"]},
                               training=True)
        token_loss, weights = losses.smoothed_cross_entropy(logits, batch["target_out"], 0.1)
        full_sum = tf.reduce_sum(token_loss)
    full_grads = [tf.convert_to_tensor(g) for g in tape.gradient(full_sum, variables)]
    grads, loss_sum, tokens, _ = trainer._grads(batch)
    assert float(tokens) == float(tf.reduce_sum(weights)) < 4 * 9
    np.testing.assert_allclose(float(loss_sum), float(full_sum), rtol=1e-6)
    for got, want in zip(grads, full_grads):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-6)


def test_two_replicas_equal_one_replica_with_the_global_batch(tmp_path):
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert mirrored.num_replicas_in_sync == 2
    two, losses_two = _train(tmp_path, "two", mirrored, [b for pair in STEPS for b in pair], 3)
    assert two.strategy.num_replicas_in_sync == 2
    one, losses_one = _train(tmp_path, "one", tf.distribute.OneDeviceStrategy("/cpu:0"),
                             [_concat(*pair) for pair in STEPS], 3)
    # Tolerance: float32 sums in a different order across devices.
    np.testing.assert_allclose(losses_two, losses_one, atol=2e-5)
    for a, b in zip(_weights(two), _weights(one)):
        np.testing.assert_allclose(a, b, atol=2e-5)


def test_accumulation_equals_a_batch_twice_as_large(tmp_path):
    device = tf.distribute.OneDeviceStrategy("/cpu:0")
    accum, losses_accum = _train(tmp_path, "accum", device, [b for pair in STEPS for b in pair],
                                 3, accum_steps=2)
    big, losses_big = _train(tmp_path, "big", device, [_concat(*pair) for pair in STEPS], 3)
    np.testing.assert_allclose(losses_accum, losses_big, atol=2e-5)
    for a, b in zip(_weights(accum), _weights(big)):
        np.testing.assert_allclose(a, b, atol=2e-5)


def test_resume_continues_the_same_loss_curve(tmp_path):
    device = tf.distribute.OneDeviceStrategy("/cpu:0")
    batches = [_concat(*pair) for pair in STEPS] + [_batch(9, 4, 6), _batch(10, 2, 3)]
    _, straight = _train(tmp_path, "straight", device, batches, 6)
    _, first = _train(tmp_path, "resumed", device, batches, 3)
    resumed, second = _train(tmp_path, "resumed", device, batches, 6)
    assert resumed.step == 6 and len(second) == 3
    np.testing.assert_allclose(first + second, straight, atol=2e-5)


def test_nan_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(tmp_path):
    device = tf.distribute.OneDeviceStrategy("/cpu:0")
    batches = [_concat(*pair) for pair in STEPS]
    # An absurd learning rate: the first update sends the weights to inf.
    trainer = Trainer(_config(learning_rate_scale=1e38, checkpoint_steps=1), str(tmp_path), device)
    with pytest.raises(NonFiniteLossError, match="at step 2"):
        trainer.train(_dataset_fn(batches), max_steps=5, log_fn=lambda line: None)
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-1")


def test_averaging_is_the_arithmetic_mean(tmp_path):
    config = _config()
    model_dir = str(tmp_path / "run")
    model_dir_lib.prepare_model_dir(model_dir, config, b"vocab")
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
    model_dir_lib.write_averaged(model_dir, 3, out, build_model)
    averaged = build_model(config.model)
    tf.train.Checkpoint(model=averaged).restore(tf.train.latest_checkpoint(out)).expect_partial()
    for got, *last in zip(averaged.get_weights(), *values[1:]):
        np.testing.assert_allclose(got, np.mean(last, axis=0), rtol=1e-6)
    assert Config.load(out) == config


def test_model_dir_for_another_model_is_refused(tmp_path):
    config = _config()
    model_dir_lib.prepare_model_dir(str(tmp_path), config, b"vocab-a")
    bigger = dataclasses.replace(config, model=dataclasses.replace(MODEL, d_model=32))
    with pytest.raises(ConfigError, match="different architecture"):
        model_dir_lib.prepare_model_dir(str(tmp_path), bigger, b"vocab-a")
    with pytest.raises(ConfigError, match="another vocabulary"):
        model_dir_lib.prepare_model_dir(str(tmp_path), config, b"vocab-b")


def read_scalars(logdir, skip=()):
    """{tag: {step: value}} of every scalar summary in the event files of `logdir`, but
    those named in `skip`."""
    scalars = {}
    for name in sorted(set(os.listdir(logdir)) - set(skip)):
        for event in tf.compat.v1.train.summary_iterator(os.path.join(logdir, name)):
            for value in event.summary.value:
                scalars.setdefault(value.tag, {})[event.step] = float(
                    tf.make_ndarray(value.tensor))
    return scalars


def test_tensorboard_scalars_hold_the_logged_loss_and_the_schedule(tmp_path):
    device = tf.distribute.OneDeviceStrategy("/cpu:0")
    lines = []
    trainer = Trainer(_config(), str(tmp_path), device)
    trainer.train(_dataset_fn([_concat(*pair) for pair in STEPS]), max_steps=3,
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
