"""Dropout masks that differ per replica and worker and are reproducible from the seed.

Keras keeps each Dropout's SeedGenerator state in a variable with
aggregation="none": under tf.distribute every replica (and every worker,
seeded alike) starts from the same state and draws the same masks. Here
every generator of the model draws, inside `scope(key)`, the stateless seed

  [layer seed + 7919 * call within this forward pass, key]

with key = (step * accum_steps + micro-batch) * replicas + global replica id
(trainer.py). The masks are then a function of (seed, layer, step,
micro-batch, replica): distinct across replicas and workers, and restored by
restoring the step, so no random state needs to be checkpointed. Outside a
scope the generators behave as Keras's own. Finding the generators and
redirecting their draws uses Keras's private API, through
keras_seed_generators.py only.
"""

from __future__ import annotations

import contextlib
import functools

import keras
import tensorflow as tf

from tf_transformer.training import keras_seed_generators

_CALL_STRIDE = 7919


class ReplicaSeeds:
    """Redirects the model's SeedGenerators to per-(step, replica) stateless seeds."""

    def __init__(self, model: keras.Model):
        self._key = None
        self._calls: dict[int, int] = {}
        self.generators = []
        for generator in keras_seed_generators.seed_generators(model):
            base = int(generator.state.numpy()[0])  # drawn from the seeded `random`
            keras_seed_generators.redirect_next(
                generator, functools.partial(self._next, generator, base))
            self.generators.append(generator)

    @contextlib.contextmanager
    def scope(self, key: tf.Tensor):
        """Draws inside use `key` (int64 scalar) as the stream counter."""
        self._key, self._calls = key, {}
        try:
            yield
        finally:
            self._key = None

    def _next(self, generator, base: int, original, ordered: bool):
        if self._key is None:
            return original(ordered=ordered)
        call = self._calls[id(generator)] = self._calls.get(id(generator), -1) + 1
        dtype = generator.state.dtype
        return tf.stack([tf.constant(base + _CALL_STRIDE * call, dtype),
                         tf.cast(self._key, dtype)])
