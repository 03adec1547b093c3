"""Keras's private seed-generator API, in one place (seeds.py is its user).

Keras 3.15 has no public way to list the SeedGenerators inside a model or to
choose what a layer's random op draws from one. This module relies on three
private facts, and on nothing else private:

- `Layer._flatten_layers(include_self=True, recursive=True)` lists a layer and
  every layer nested in it, once each;
- `Layer._seed_generators` lists the SeedGenerators a layer owns (a Dropout
  with a non-zero rate owns one);
- a random op draws its seed through `keras.src.random.seed_generator.draw_seed`,
  which calls `generator.next()`: an attribute looked up on the instance, so an
  instance attribute `next` replaces the method for that generator only.

tests/training/test_keras_seed_generators.py fails if any of them changes: the
generators found must be exactly the model's Dropout generators, and a
redirected `next` must decide the Dropout's mask.
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import tensorflow as tf

# replacement(original_next, ordered) -> the seed to draw: [2] in the generator's state dtype.
Replacement = Callable[[Callable[..., tf.Tensor], bool], tf.Tensor]


def seed_generators(model: keras.layers.Layer) -> list[keras.random.SeedGenerator]:
    """Every SeedGenerator owned by `model` or a layer nested in it, in layer order."""
    return [generator
            for layer in model._flatten_layers(include_self=True, recursive=True)
            for generator in layer._seed_generators]


def redirect_next(generator: keras.random.SeedGenerator, replacement: Replacement) -> None:
    """Seeds drawn from `generator` come from now on from `replacement(original, ordered)`,
    `original` being Keras's own `next` (call it to draw as Keras would)."""
    original = generator.next

    def next_seed(ordered: bool = True) -> tf.Tensor:
        return replacement(original, ordered)

    generator.next = next_seed
