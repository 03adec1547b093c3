"""Test set-up: quiet TensorFlow, and the CPU split into logical devices.

Two logical CPU devices let MirroredStrategy run real multi-replica training
in tests on a machine without GPUs; it must happen before TensorFlow
initialises its devices, hence at import time here.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # noqa: E402

TEST_CPU_DEVICES = 2
_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    _cpus[0], [tf.config.LogicalDeviceConfiguration()] * TEST_CPU_DEVICES)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
