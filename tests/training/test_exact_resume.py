"""Exact resume: N steps = N/2 + resume + N/2, with dropout and a shuffled, bucketed input."""

import dataclasses

import numpy as np
import tensorflow as tf
from trainer_fixtures import MODEL, weights_but_key_biases

from tf_transformer.config import Config, DataConfig, TrainConfig
from tf_transformer.inputs import corpus, pipeline
from tf_transformer.training.trainer import Trainer


def _run(model_dir, pairs, tokenizer, max_steps, trainer=None):
    """`max_steps` steps of a new trainer, or of `trainer` (its traced loop reused) after
    `_forget`."""
    config = Config(model=dataclasses.replace(MODEL, vocab_size=tokenizer.vocab_size, dropout=0.3),
                    data=DataConfig(max_length=32, tokens_per_batch=256, shuffle_buffer=50,
                                    deterministic=True),
                    train=TrainConfig(warmup_steps=10, log_every=1, checkpoint_minutes=1e9))

    def dataset_fn(start_step):
        # A new seed on a fresh start would change the batches: the position must be restored.
        data = dataclasses.replace(config.data, seed=config.data.seed + start_step)
        return pipeline.dataset_fn(pairs, tokenizer, data, training=True)

    if trainer is None:
        trainer = Trainer(config, model_dir, tf.distribute.OneDeviceStrategy("/cpu:0"))
    else:
        _forget(trainer)
    lines = []
    trainer.train(dataset_fn, max_steps=max_steps, log_fn=lines.append)
    return trainer, [float(l.split("loss=")[1].split()[0]) for l in lines]


def _forget(trainer):
    """The trainer as a new process would start it before restoring: every checkpointed
    variable (weights, Adam's slots and step count) zeroed, so only the checkpoint can give
    them back."""
    for variable in trainer.model.weights + trainer.optimizer.variables:
        variable.assign(tf.zeros_like(variable))
    assert trainer.step == 0


def test_half_resume_half_equals_straight(tmp_path, embedded_corpus, small_tokenizer):
    pairs = corpus.Corpus(embedded_corpus.sources[:100], embedded_corpus.targets[:100])
    straight, losses = _run(str(tmp_path / "straight"), pairs, small_tokenizer, 6)
    half, first = _run(str(tmp_path / "resumed"), pairs, small_tokenizer, 3)
    resumed, second = _run(str(tmp_path / "resumed"), pairs, small_tokenizer, 6, trainer=half)
    assert resumed.inputs.restored_step == 3 and resumed.inputs.has(6)
    print("input position per checkpoint:", resumed.inputs.last_save)
    np.testing.assert_allclose(first + second, losses, atol=2e-5)
    for a, b in zip(weights_but_key_biases(resumed), weights_but_key_biases(straight)):
        np.testing.assert_allclose(a, b, atol=2e-5)
