"""The input position as part of a checkpoint: tf.data's own iterator state.

Bucketed token batches make the batch sequence depend on every pair seen so
far (shuffle buffer, open bucket windows), so "skip the first N batches" on a
rebuilt pipeline would re-tokenise the whole consumed stream. Instead each
worker saves its iterator (shuffle buffer, bucket windows and prefetched
batches included) next to the model checkpoint, under its own directory

  model_dir/input/worker_<i>/input-<step>

(workers read different shards, so each keeps its own). The cost is the size
of those buffers; `last_save` records bytes and seconds of the latest save.
"""

from __future__ import annotations

import os
import time

import tensorflow as tf
from absl import logging


class InputCheckpoint:
    def __init__(self, model_dir: str, worker_index: int, max_to_keep: int):
        self.directory = os.path.join(model_dir, "input", f"worker_{worker_index}")
        self.max_to_keep = max_to_keep
        self.manager = None
        self.last_save = {"bytes": 0, "seconds": 0.0}
        self.restored_step: int | None = None

    def has(self, step: int) -> bool:
        """Whether a saved position for exactly `step` exists."""
        path = tf.train.latest_checkpoint(self.directory)
        return bool(path) and path.endswith(f"-{step}")

    def attach(self, iterator) -> None:
        self.manager = tf.train.CheckpointManager(
            tf.train.Checkpoint(iterator=iterator), self.directory,
            max_to_keep=self.max_to_keep, checkpoint_name="input")

    def restore(self, step: int) -> None:
        path = self.manager.latest_checkpoint
        self.manager.checkpoint.restore(path).assert_consumed()
        self.restored_step = step
        logging.info("restored the input position of step %d from %s", step, path)

    def save(self, step: int) -> str | None:
        """Saves the position of `step`; a pipeline tf.data cannot save (from_generator)
        is reported once and then resumes from a fresh position."""
        started = time.perf_counter()
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
