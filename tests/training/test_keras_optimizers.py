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


def _adam_steps(optimizer_class, strategy, steps=5):
    """A 3x4 weight and a bias after `steps` pre-reduced Adam updates of a quadratic loss's
    gradients (the same on every replica); each replica's copy."""
    rng = np.random.default_rng(0)
    x = tf.constant(rng.random((2, 3), np.float32))
    with strategy.scope():
        weights = [keras.Variable(rng.random((3, 4), np.float32)), keras.Variable(np.ones(4))]
        optimizer = keras_optimizers.pre_reduced(optimizer_class)(
            learning_rate=0.01, beta_1=0.9, beta_2=0.98, epsilon=1e-9)
        optimizer.build(weights)

    def replica_step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(tf.matmul(x, weights[0]) + weights[1]))
        optimizer.apply_gradients(zip(tape.gradient(loss, weights), weights))

    step = tf.function(lambda: strategy.run(replica_step), autograph=False)
    for _ in range(steps):
        step()
    assert int(optimizer.iterations.numpy()) == steps
    return [[c.numpy() for c in strategy.experimental_local_results(w.value)] for w in weights]


@pytest.mark.parametrize("replicas", [1, 2])
def test_the_fused_adam_update_is_keras_adams(replicas):
    """ResourceApplyAdam's arithmetic is Keras's Adam's: equal weights after 5 steps, on
    one device and on every copy of two replicas (it reads each device's own slots)."""
    def strategy():
        return _mirrored() if replicas == 2 else tf.distribute.OneDeviceStrategy("/cpu:0")

    fused_class = keras_optimizers.fused_adam()
    assert issubclass(fused_class, keras.optimizers.Adam)
    keras_weights = _adam_steps(keras.optimizers.Adam, strategy())
    fused_weights = _adam_steps(fused_class, strategy())
    for keras_copies, fused_copies in zip(keras_weights, fused_weights):
        assert len(fused_copies) == replicas
        for copy in fused_copies:
            np.testing.assert_allclose(copy, keras_copies[0], rtol=1e-6, atol=1e-7)
    moved = np.abs(fused_weights[0][0] - _adam_steps(fused_class, strategy(), steps=4)[0][0])
    assert moved.max() > 1e-3  # a step moves the weights: the comparison is not vacuous
