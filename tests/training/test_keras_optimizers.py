"""Guards the Keras private hook behind training/keras_optimizers.py (Keras 3.15).

Plain SGD with learning rate 1 moves a variable by exactly minus the gradient
it applies, so the update shows how many times the gradient was summed. Both
replicas apply the same gradient: pre-reduced, the update is that gradient
once; Keras's own optimizer sums it over the 2 replicas. If Keras stopped
calling `_all_reduce_sum_gradients`, the pre-reduced update would be the sum
too and the first test would fail; the second shows the hook is live.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.training import keras_optimizers

GRADIENT = np.array([1.0, -2.0, 0.5], np.float32)


def _update(make_optimizer, strategy):
    """-(variable after one apply_gradients of GRADIENT on every replica), from zeros."""
    with strategy.scope():
        variable = keras.Variable(np.zeros(3, np.float32))
        optimizer = make_optimizer()
        optimizer.build([variable])

    @tf.function(autograph=False)
    def step():
        strategy.run(lambda: optimizer.apply_gradients([(tf.constant(GRADIENT), variable)]))

    step()
    values = [v.numpy() for v in strategy.experimental_local_results(variable.value)]
    np.testing.assert_array_equal(values[0], values[-1])  # the mirrored copies agree
    return -values[0]


def _mirrored():
    # Reduction by copies to one device, not collective ops: collectives are keyed by
    # counters that restart with each strategy in the process, and a key reused with
    # another shape (the trainer tests' first all-reduce has 7 values) fails.
    strategy = tf.distribute.MirroredStrategy(
        ["/cpu:0", "/cpu:1"], cross_device_ops=tf.distribute.ReductionToOneDevice())
    assert strategy.num_replicas_in_sync == 2
    return strategy


def test_pre_reduced_applies_the_gradient_once_under_two_replicas():
    sgd = keras_optimizers.pre_reduced(keras.optimizers.SGD)
    np.testing.assert_array_equal(_update(lambda: sgd(learning_rate=1.0), _mirrored()), GRADIENT)
    # float16 training: LossScaleOptimizer unscales, then applies through the inner optimizer.
    scaled = _update(lambda: keras.optimizers.LossScaleOptimizer(
        sgd(learning_rate=1.0), initial_scale=4.0), _mirrored())
    np.testing.assert_array_equal(scaled, GRADIENT / 4.0)


def test_keras_own_optimizer_sums_over_the_replicas():
    """The hook is live: without the override the same step applies the sum."""
    update = _update(lambda: keras.optimizers.SGD(learning_rate=1.0), _mirrored())
    np.testing.assert_array_equal(update, 2 * GRADIENT)


def test_pre_reduced_classes_are_subclasses_and_marked():
    adam = keras_optimizers.pre_reduced(keras.optimizers.Adam)(learning_rate=1e-3)
    assert isinstance(adam, keras.optimizers.Adam) and keras_optimizers.is_pre_reduced(adam)
    assert type(adam).__name__ == "PreReducedAdam"
    assert not keras_optimizers.is_pre_reduced(keras.optimizers.Adam(learning_rate=1e-3))


def test_a_class_without_the_hook_is_refused():
    class NoHook:
        pass

    with pytest.raises(TypeError, match="_all_reduce_sum_gradients"):
        keras_optimizers.pre_reduced(NoHook)
