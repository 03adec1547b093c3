"""Dropout keys of the step (training/step.py): different masks on each replica, a distinct
key per (step, micro-batch, replica), and the same masks again after a restore. (The same
weights again from the same seed, with dropout on two replicas: test_host_loop.py, resumed
runs equal to a straight one.)"""

import dataclasses

import numpy as np
import tensorflow as tf
from trainer_fixtures import MODEL, random_batch

from tf_transformer.config import Config, TrainConfig
from tf_transformer.training.trainer import Trainer

DROPOUT = dataclasses.replace(MODEL, dropout=0.3)


def _trainer(tmp_path, name, strategy, **train):
    config = Config(model=DROPOUT, train=TrainConfig(warmup_steps=10, log_every=1,
                                                     checkpoint_minutes=1e9, **train))
    return Trainer(config, str(tmp_path / name), strategy)


def _batch():
    return {k: tf.constant(v) for k, v in random_batch(1, 4, 6).items()}


def _mirrored():
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def test_replicas_draw_different_masks(tmp_path):
    mirrored = _mirrored()
    step = _trainer(tmp_path, "run", mirrored).train_step
    batch = _batch()

    @tf.function(autograph=False)
    def loss_per_replica():
        # The same batch on both replicas: only the dropout masks can differ.
        return mirrored.run(lambda: step.grads(batch, step.dropout_key(0))[1])

    losses = [float(v) for v in mirrored.experimental_local_results(loss_per_replica())]
    assert abs(losses[0] - losses[1]) > 1e-3
    again = [float(v) for v in mirrored.experimental_local_results(loss_per_replica())]
    assert again == losses  # a function of (seed, step, replica): the step has not moved


def test_each_step_micro_batch_and_replica_has_its_own_key(tmp_path):
    """key = (step * accum_steps + micro-batch) * replicas + global replica id."""
    mirrored = _mirrored()
    trainer = _trainer(tmp_path, "run", mirrored, accum_steps=2)
    step = trainer.train_step

    @tf.function(autograph=False)
    def keys():
        return mirrored.run(lambda: tf.stack([step.dropout_key(0), step.dropout_key(1)]))

    def per_replica():
        return [v.numpy().tolist() for v in mirrored.experimental_local_results(keys())]

    assert per_replica() == [[0, 2], [1, 3]]
    trainer.optimizer.iterations.assign(5)
    assert per_replica() == [[20, 22], [21, 23]]


def test_a_restored_trainer_draws_the_same_masks(tmp_path):
    """The masks are a function of the seed and the step: restoring the step restores them."""
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    first = _trainer(tmp_path, "run", strategy)
    first.optimizer.iterations.assign(3)
    first.save()
    resumed = _trainer(tmp_path, "run", strategy)
    assert resumed.restore() == 3
    batch = _batch()

    def loss(trainer):
        step = trainer.train_step
        return float(strategy.run(tf.function(
            lambda: step.loss_sums(batch, step.dropout_key(0))[0], autograph=False)))

    at_three = loss(first)
    assert loss(resumed) == at_three
    first.optimizer.iterations.assign(4)
    assert not np.isclose(loss(first), at_three)
