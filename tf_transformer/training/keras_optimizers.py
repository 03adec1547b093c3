"""Keras's private optimizer hook, in one place: optimizers for pre-reduced gradients.

The trainer all-reduces the gradients itself (it needs their sum anyway, to
divide by the global token count and to log its norm), so the optimizer must
not sum them over the replicas again. Keras 3.15's TensorFlow optimizers do
that sum in one private method, `_all_reduce_sum_gradients(grads_and_vars)`,
called by every `apply_gradients` before the update; `pre_reduced` makes it
the identity. LossScaleOptimizer applies through its inner optimizer, so a
pre-reduced inner optimizer is enough.

tests/training/test_keras_optimizers.py fails if Keras stops calling the hook
(under MirroredStrategy the update would then be the sum over replicas).
"""

from __future__ import annotations

import keras

_HOOK = "_all_reduce_sum_gradients"


class _PreReduced:
    def _all_reduce_sum_gradients(self, grads_and_vars):
        return list(grads_and_vars)


def pre_reduced(optimizer_class: type[keras.optimizers.Optimizer]) -> type:
    """A subclass of `optimizer_class` whose updates use the gradients as given, not summed
    over the replicas. Raises TypeError if the class has no such hook to override."""
    if not callable(getattr(optimizer_class, _HOOK, None)):
        raise TypeError(f"{optimizer_class.__name__} has no {_HOOK}: the Keras optimizer API "
                        "changed, and gradients would be all-reduced twice")
    return type(f"PreReduced{optimizer_class.__name__}", (_PreReduced, optimizer_class), {})


def is_pre_reduced(optimizer: keras.optimizers.Optimizer) -> bool:
    """Whether `optimizer` is an instance of a `pre_reduced` class."""
    return isinstance(optimizer, _PreReduced)
