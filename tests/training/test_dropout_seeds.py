"""Dropout: different masks on each replica, the same run again from the same seed."""

import dataclasses

import numpy as np
import tensorflow as tf
from trainer_fixtures import MODEL, STEPS, dataset_of, random_batch, weights_but_key_biases

from tf_transformer.config import Config, TrainConfig
from tf_transformer.training.trainer import Trainer

DROPOUT = dataclasses.replace(MODEL, dropout=0.3)


def _trainer(tmp_path, name, strategy):
    config = Config(model=DROPOUT, train=TrainConfig(warmup_steps=10, log_every=1,
                                                     checkpoint_minutes=1e9))
    return Trainer(config, str(tmp_path / name), strategy)


def test_replicas_draw_different_masks(tmp_path):
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    trainer = _trainer(tmp_path, "run", mirrored)
    batch = {k: tf.constant(v) for k, v in random_batch(1, 4, 6).items()}

    @tf.function
    def loss_per_replica():
        # The same batch on both replicas: only the dropout masks can differ.
        return mirrored.run(lambda: trainer._grads(batch, trainer._seed_key(0))[1])

    losses = [float(v) for v in mirrored.experimental_local_results(loss_per_replica())]
    assert abs(losses[0] - losses[1]) > 1e-3
    again = [float(v) for v in mirrored.experimental_local_results(loss_per_replica())]
    assert again == losses  # a function of (seed, step, replica): the step has not moved


def test_same_seed_same_weights_with_dropout_on_two_replicas(tmp_path):
    runs = []
    for name in ("a", "b"):
        mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        trainer = _trainer(tmp_path, name, mirrored)
        trainer.train(dataset_of([b for pair in STEPS for b in pair]), max_steps=3,
                      log_fn=lambda line: None)
        runs.append(weights_but_key_biases(trainer))
    for a, b in zip(*runs):
        np.testing.assert_allclose(a, b, atol=1e-6)
