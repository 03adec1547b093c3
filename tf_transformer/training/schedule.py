"""The learning rate of section 5.3 and the paper's Adam."""

import keras
import tensorflow as tf

from tf_transformer.config import TrainConfig
from tf_transformer.training import keras_optimizers


@keras.saving.register_keras_serializable(package="tf_transformer")
class WarmupInverseSqrt(keras.optimizers.schedules.LearningRateSchedule):
    """lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5).

    Steps count from 1 (the optimizer's iteration counter starts at 0, so
    `step` here is iterations + 1: the first update uses a non-zero rate).
    """

    def __init__(self, d_model: int, warmup_steps: int = 4000, scale: float = 1.0):
        self.d_model = d_model
        self.warmup_steps = warmup_steps
        self.scale = scale

    def __call__(self, step):
        step = tf.cast(step, tf.float32) + 1.0
        return (self.scale * self.d_model ** -0.5
                * tf.minimum(tf.math.rsqrt(step), step * self.warmup_steps ** -1.5))

    def get_config(self):
        return {"d_model": self.d_model, "warmup_steps": self.warmup_steps, "scale": self.scale}


def make_optimizer(train: TrainConfig, d_model: int, pre_reduced: bool = False):
    """Adam(beta1 0.9, beta2 0.98, eps 1e-9) on the warmup/inverse-sqrt schedule.

    `pre_reduced`: for gradients the trainer has already all-reduced
    (keras_optimizers.pre_reduced: Adam does not sum them over replicas again)."""
    adam = keras_optimizers.fused_adam()  # one kernel per variable's update
    if pre_reduced:
        adam = keras_optimizers.pre_reduced(adam)
    return adam(
        learning_rate=WarmupInverseSqrt(d_model, train.warmup_steps, train.learning_rate_scale),
        beta_1=train.adam_beta_1, beta_2=train.adam_beta_2, epsilon=train.adam_epsilon)
