"""Keras's private optimizer API, in one place: optimizers for pre-reduced gradients, and
Adam's update as one fused kernel per variable.

The trainer all-reduces the gradients itself (it needs their sum anyway, to
divide by the global token count and to log its norm), so the optimizer must
not sum them over the replicas again. Keras 3.15's TensorFlow optimizers do
that sum in one private method, `_all_reduce_sum_gradients(grads_and_vars)`,
called by every `apply_gradients` before the update; `pre_reduced` makes it
the identity. LossScaleOptimizer applies through its inner optimizer, so a
pre-reduced inner optimizer is enough.

`fused_adam()` is keras.optimizers.Adam whose per-variable `update_step` is
TensorFlow's ResourceApplyAdam: the same arithmetic (m and v, then
var -= m * alpha / (sqrt(v) + epsilon), alpha = lr * sqrt(1 - beta2^t) / (1 - beta1^t)),
one kernel and one pass over the variable instead of about ten ops, each a pass
(fewer launches per step on a GPU, less memory traffic on a CPU). It reads Adam's
private slots (`_momentums`, `_velocities`, `_get_variable_index`); the checkpoint
holds the same variables as Keras's Adam.

tests/training/test_keras_optimizers.py fails if Keras stops calling the hook
(under MirroredStrategy the update would then be the sum over replicas), or if the
fused update leaves Keras's Adam.
"""

from __future__ import annotations

import keras
import tensorflow as tf

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


class _FusedAdamUpdate:
    def update_step(self, gradient, variable, learning_rate):
        if self.amsgrad:
            raise ValueError("the fused Adam update has no amsgrad")
        index = self._get_variable_index(variable)
        dtype = variable.dtype
        step = tf.cast(self.iterations + 1, dtype)
        beta_1, beta_2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
        m, v = (getattr(slot[index], "value", slot[index])
                for slot in (self._momentums, self._velocities))
        tf.raw_ops.ResourceApplyAdam(
            var=variable.handle, m=m.handle, v=v.handle, beta1_power=tf.pow(beta_1, step),
            beta2_power=tf.pow(beta_2, step), lr=tf.cast(learning_rate, dtype), beta1=beta_1,
            beta2=beta_2, epsilon=tf.cast(self.epsilon, dtype), grad=tf.cast(gradient, dtype))


def fused_adam() -> type:
    """keras.optimizers.Adam with the fused update. Raises TypeError if Adam no longer
    has the private method that finds a variable's slots."""
    if not callable(getattr(keras.optimizers.Adam, "_get_variable_index", None)):
        raise TypeError("keras.optimizers.Adam has no _get_variable_index: its private API "
                        "changed; the fused update cannot find a variable's slots")
    return type("FusedAdam", (_FusedAdamUpdate, keras.optimizers.Adam), {})
