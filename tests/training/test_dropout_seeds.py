"""Dropout: different masks on each replica. (The same weights again from the same seed, with
dropout on two replicas: test_host_loop.py, resumed runs equal to a straight one.)"""

import dataclasses

import tensorflow as tf
from trainer_fixtures import MODEL, random_batch

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

    @tf.function(autograph=False)
    def loss_per_replica():
        # The same batch on both replicas: only the dropout masks can differ.
        return mirrored.run(lambda: trainer._grads(batch, trainer._seed_key(0))[1])

    losses = [float(v) for v in mirrored.experimental_local_results(loss_per_replica())]
    assert abs(losses[0] - losses[1]) > 1e-3
    again = [float(v) for v in mirrored.experimental_local_results(loss_per_replica())]
    assert again == losses  # a function of (seed, step, replica): the step has not moved

