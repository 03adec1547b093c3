"""The input position as part of a checkpoint, with the batches already on the devices.

Bucketed token batches make the batch sequence depend on every pair seen so
far (shuffle buffer, open bucket windows), so "skip the first N batches" on a
rebuilt pipeline would re-tokenise the whole consumed stream. Instead each
worker saves its iterator (shuffle buffer, bucket windows and prefetched
batches included) next to the model checkpoint, under its own directory

  model_dir/input/worker_<i>/input-<step>   (ModelDir.input_state_dir)

(workers read different shards, so each keeps its own). The cost is the size
of those buffers; `last_save` records bytes and seconds of the latest save.

The trainer keeps the next step's batches on the replicas' devices (`Staged`:
copied while the current step computes). They have left the iterator, so the
checkpoint holds them too, serialized: the iterator's position plus the staged
batches is exactly the consumed position. tf.distribute's own distributed
iterators (`distribute_datasets_from_function`) cannot be saved in TensorFlow
2.21 (not `Trackable`; their per-device buffers have no save op), so exact
resume rules them out.
"""

from __future__ import annotations

import os
import time

import tensorflow as tf
from absl import logging

from tf_transformer.model_dir import ModelDir


class Staged:
    """One step's batches on this worker's devices: `batches[r][i]` is replica r's
    micro-batch i, a dict of tensors on `devices[r]`; element i * local + r of
    the iterator (the order tf.distribute hands elements to local replicas)."""

    def __init__(self, devices: list[str], accum_steps: int):
        self.devices, self.accum_steps = list(devices), accum_steps

    def fetch(self, iterator):
        """The next step's batches from `iterator`, copied to the devices (graph or eager)."""
        local = len(self.devices)
        elements = [next(iterator) for _ in range(self.accum_steps * local)]
        batches = []
        for r, device in enumerate(self.devices):
            with tf.device(device):
                batches.append(tuple({k: tf.identity(v) for k, v in elements[i * local + r].items()}
                                     for i in range(self.accum_steps)))
        return tuple(batches)

    def template(self, element_spec):
        """The nest of TensorSpecs of `fetch`'s result, from the iterator's element_spec."""
        return tuple(tuple(dict(element_spec) for _ in range(self.accum_steps))
                     for _ in self.devices)

    def relaxed(self, staged):
        """Shape invariants for a loop carrying `staged`: any rows and length."""
        return tf.nest.map_structure(lambda t: tf.TensorShape([None] * t.shape.rank), staged)

    def serialize(self, staged) -> tf.Tensor:
        """[n] string: each tensor of the nest, serialized (a device-to-host copy)."""
        return tf.stack([tf.io.serialize_tensor(t) for t in tf.nest.flatten(staged)])

    def deserialize(self, serialized: tf.Tensor, element_spec):
        """`serialize`'s nest again, each tensor on its replica's device."""
        template = self.template(element_spec)
        specs = tf.nest.flatten(template)
        flat = [tf.io.parse_tensor(serialized[i], spec.dtype) for i, spec in enumerate(specs)]
        nest = tf.nest.pack_sequence_as(template, flat)
        placed = []
        for replica, device in zip(nest, self.devices):
            with tf.device(device):
                placed.append(tuple({k: tf.identity(v) for k, v in batch.items()}
                                    for batch in replica))
        return tuple(placed)


class InputCheckpoint:
    def __init__(self, model_dir: ModelDir, worker_index: int, max_to_keep: int):
        self.directory = model_dir.input_state_dir(worker_index)
        self.max_to_keep = max_to_keep
        self.manager = None
        self.last_save = {"bytes": 0, "seconds": 0.0}
        self.restored_step: int | None = None
        # The staged batches, serialized ([] when none are staged).
        self.staged = tf.Variable(tf.constant([], tf.string), shape=tf.TensorShape([None]),
                                  trainable=False)

    def has(self, step: int) -> bool:
        """Whether a saved position for exactly `step` exists."""
        path = tf.train.latest_checkpoint(self.directory)
        return bool(path) and path.endswith(f"-{step}")

    def attach(self, iterator) -> None:
        self.manager = tf.train.CheckpointManager(
            tf.train.Checkpoint(iterator=iterator, staged=self.staged), self.directory,
            max_to_keep=self.max_to_keep, checkpoint_name="input")

    def restore(self, step: int) -> tf.Tensor:
        """Restores the position of `step`; returns the staged batches, serialized
        ([] when none were staged, or for a checkpoint written before staging)."""
        path = self.manager.latest_checkpoint
        status = self.manager.checkpoint.restore(path)
        names = {name for name, _ in tf.train.list_variables(path)}
        if any(name.startswith("staged/") for name in names):
            status.assert_consumed()
        else:
            self.staged.assign(tf.constant([], tf.string))
            status.assert_existing_objects_matched()
        self.restored_step = step
        logging.info("restored the input position of step %d from %s", step, path)
        return self.staged.read_value()

    def save(self, step: int, staged_serialized: tf.Tensor | None = None) -> str | None:
        """Saves the position of `step` with the serialized staged batches (or none);
        a pipeline tf.data cannot save (from_generator) is reported once and then
        resumes from a fresh position."""
        started = time.perf_counter()
        self.staged.assign(staged_serialized if staged_serialized is not None
                           else tf.constant([], tf.string))
        try:
            path = self.manager.save(checkpoint_number=step)
        except (tf.errors.OpError, ValueError) as error:
            logging.warning("the input position cannot be saved (%s); resuming will restart "
                            "the input", str(error).splitlines()[0])
            self.manager = None
            return None
        seconds = time.perf_counter() - started
        size = sum(os.path.getsize(os.path.join(self.directory, f))
                   for f in os.listdir(self.directory)
                   if f.startswith(os.path.basename(path) + "."))
        self.last_save = {"bytes": size, "seconds": seconds}
        logging.info("saved the input position (%d bytes, %.2f s) %s", size, seconds, path)
        return path
