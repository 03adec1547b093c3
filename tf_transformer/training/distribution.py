"""Choosing a tf.distribute strategy: one device, local mirrored, or multi-worker."""

import json
import os
import time

import tensorflow as tf
from absl import logging

STRATEGIES = ("auto", "one_device", "mirrored", "multi_worker")


def set_threads(intra_op: int = 0, inter_op: int = 0) -> None:
    """TensorFlow's thread pools (0 keeps TensorFlow's default); before TF initialises."""
    if intra_op:
        tf.config.threading.set_intra_op_parallelism_threads(intra_op)
    if inter_op:
        tf.config.threading.set_inter_op_parallelism_threads(inter_op)


def split_cpu(num_devices: int) -> None:
    """Splits the CPU into `num_devices` logical devices (before TF initialises).

    Lets MirroredStrategy run, and be tested, with several replicas on a
    machine without GPUs.
    """
    if num_devices <= 1:
        return
    cpus = tf.config.list_physical_devices("CPU")
    current = tf.config.get_logical_device_configuration(cpus[0])
    if current and len(current) == num_devices:
        return
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration()] * num_devices)


def make_strategy(name: str = "auto", cpu_devices: int = 0) -> tf.distribute.Strategy:
    """auto: MirroredStrategy over local GPUs (or over `cpu_devices` logical
    CPUs), one device otherwise; multi_worker: MultiWorkerMirroredStrategy
    configured by the TF_CONFIG environment variable."""
    if name not in STRATEGIES:
        raise ValueError(f"--strategy must be one of {STRATEGIES}, got {name!r}")
    if name == "multi_worker":
        if "TF_CONFIG" not in os.environ:
            raise ValueError("--strategy=multi_worker needs TF_CONFIG (cluster and task)")
        task = json.loads(os.environ["TF_CONFIG"]).get("task", {})
        logging.info("multi-worker task %s", task)
        return tf.distribute.MultiWorkerMirroredStrategy()
    gpus = tf.config.list_logical_devices("GPU")
    cpus = tf.config.list_logical_devices("CPU")
    if name == "one_device":
        return tf.distribute.OneDeviceStrategy((gpus or cpus)[0].name)
    if gpus and (name == "mirrored" or len(gpus) > 1):
        return tf.distribute.MirroredStrategy([d.name for d in gpus])
    if cpu_devices > 1 or name == "mirrored":
        devices = cpus[:cpu_devices] if cpu_devices > 1 else cpus
        return tf.distribute.MirroredStrategy([d.name for d in devices])
    return tf.distribute.OneDeviceStrategy((gpus or cpus)[0].name)


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """Whether this process writes summaries and the primary checkpoints."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) or resolver is None:
        return True
    return resolver.task_type in (None, "chief") or (
        resolver.task_type == "worker" and resolver.task_id == 0)


def local_replicas(strategy: tf.distribute.Strategy) -> int:
    """Replicas of this worker (all of them but under MultiWorkerMirroredStrategy)."""
    try:
        return len(strategy.extended.worker_devices)
    except RuntimeError:  # the default strategy
        return strategy.num_replicas_in_sync


def wait_for_file(path: str, timeout_s: float = 3600.0, poll_s: float = 1.0) -> None:
    """Blocks until `path` exists (written by the chief with an atomic rename)."""
    deadline = time.monotonic() + timeout_s
    logging.info("waiting for %s from the chief", path)
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout_s:.0f} s")
        time.sleep(poll_s)
