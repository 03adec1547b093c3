"""Choosing a tf.distribute strategy: one device, local mirrored, or multi-worker; the
devices of this worker's replicas and an evaluation split over all of them (`Shards`)."""

import concurrent.futures
import json
import os
import time

import numpy as np
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
    return len(local_devices(strategy))


def local_devices(strategy: tf.distribute.Strategy) -> list[str]:
    """The devices of this worker's replicas, in replica order ("" under the default
    strategy: TensorFlow's default placement)."""
    try:
        return list(strategy.extended.worker_devices)
    except RuntimeError:  # the default strategy
        return [""] * strategy.num_replicas_in_sync


def device_type(devices: list[str]) -> str:
    """"GPU" or "CPU": the type of the replicas' devices (an unnamed device is a GPU
    when one is visible, as TensorFlow places it)."""
    named = tf.DeviceSpec.from_string(devices[0] if devices else "").device_type
    if named:
        return named.upper()
    return "GPU" if tf.config.list_logical_devices("GPU") else "CPU"


def wait_for_file(path: str, timeout_s: float = 3600.0, poll_s: float = 1.0) -> None:
    """Blocks until `path` exists (written by the chief with an atomic rename)."""
    deadline = time.monotonic() + timeout_s
    logging.info("waiting for %s from the chief", path)
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout_s:.0f} s")
        time.sleep(poll_s)


class Shards:
    """An evaluation split over every replica of every worker.

    Replica r of worker w takes shard w * local + r of `count` (a global replica
    id); `map` runs this worker's shards side by side, one thread per device,
    each under the strategy's scope and its device (so a mirrored variable is
    read from that device's copy); `sum` adds this worker's figures to every
    other worker's (one all-reduce across workers; none on a single worker).
    Every worker must call `sum` the same number of times, as the trainer's
    evaluations do (all at the same steps).
    """

    def __init__(self, strategy: tf.distribute.Strategy):
        self.strategy = strategy
        self.devices = local_devices(strategy)
        self.count = strategy.num_replicas_in_sync
        self.workers = self.count // len(self.devices)
        resolver = getattr(strategy, "cluster_resolver", None)
        worker = (resolver.task_id or 0) if self.workers > 1 else 0
        self.local = [worker * len(self.devices) + r for r in range(len(self.devices))]

    def map(self, fn) -> list:
        """[fn(shard) for each local shard], each run on its device (in parallel)."""
        def run(shard, device):
            with self.strategy.scope(), tf.device(device):
                return fn(shard)

        if len(self.devices) == 1:
            return [run(self.local[0], self.devices[0])]
        with concurrent.futures.ThreadPoolExecutor(len(self.devices)) as pool:
            return list(pool.map(run, self.local, self.devices))

    def sum(self, values) -> np.ndarray:
        """float64 [n]: `values` [n] summed over every worker."""
        values = np.asarray(values, np.float64)
        if self.workers == 1:
            return values
        local = len(self.devices)
        per_replica = self.strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant(values if ctx.replica_id_in_sync_group % local == 0
                                    else np.zeros_like(values)))
        return self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None).numpy()
