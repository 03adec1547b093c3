"""The host's side of the training loop: it queues steps and reads the device only at syncs.

A call runs up to `steps_per_call` steps in one tf.function (`make_loop`: a
tf.while_loop, Orbit's steps_per_loop); each step's figures are one row of a
[steps, STATS] tensor that the host holds without reading (`Calls`). The host
reads the device only at a sync step (logging, evaluation, checkpoint,
max_steps: policies.next_sync_step), where one copy brings every row since the
last sync (`Calls.sync_points`, `account`). A step whose all-reduced flags
(step.py: signal, budget, checkpoint time) are set ends its call and stores them
in the `pending` variable; while it is set, calls run nothing, so every worker acts on
the flags after the same step though none reads them every step. Each step
copies the next step's batches to the devices while it computes
(input_state.Staged); the host holds them between calls and saves them with
the input position. Both receive the step (step.py: TrainStep) and call only its
public methods.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from tf_transformer.model_dir import ModelDir
from tf_transformer.training.policies import next_sync_step
from tf_transformer.training.reporting import ProgressReporter

# The columns of a step's row of figures (the optimizer's iteration count after the step
# last: a skipped mixed_float16 step leaves it unchanged; exact below 2^24 steps).
STATS = ("loss", "target_tokens", "source_tokens", "grad_norm", "flops",
         "flag_signal", "flag_budget", "flag_checkpoint", "iterations")
FLAGS = slice(5, 8)


class NonFiniteLossError(RuntimeError):
    """Training produced a NaN or Inf loss; the last good checkpoint is kept."""


def row(out: dict, iterations) -> tf.Tensor:
    """A step's outputs (TrainStep.run) as one [len(STATS)] float32 row, on the device."""
    return tf.stack([out["loss"], out["target_tokens"], out["source_tokens"], out["grad_norm"],
                     out["flops"], out["flags"][0], out["flags"][1], out["flags"][2],
                     tf.cast(iterations, tf.float32)])


def make_loop(step, pending: tf.Variable) -> Callable:
    """call(iterator, staged, flags, n, more) -> (rows, staged, staged_valid).

    Runs up to `n` steps (int32) of `step` (TrainStep) on `staged` batches, each
    copying the next step's batches to the devices while it computes; `flags` ride
    the first step's all-reduce. A step whose summed flags are set is the call's
    last and stores them in `pending` ([3] float32); while it is set the call runs nothing. `more`
    (bool): fetch batches after the n-th step (False at max_steps, so the iterator
    is never read past the last step). rows [steps run, len(STATS)].
    """

    @tf.function(autograph=False)
    def loop(iterator, staged, flags, n, more):
        rows = tf.TensorArray(tf.float32, size=0, dynamic_size=True, element_shape=[len(STATS)])

        def body(i, staged, valid, rows, go):
            fetch = tf.logical_or(i + 1 < n, more)
            upcoming = tf.cond(fetch, lambda: step.staging.fetch(iterator), lambda: staged)
            out = step.run(staged, tf.where(i == 0, flags, tf.zeros_like(flags)))
            raised = tf.reduce_any(out["flags"] > 0)
            with tf.control_dependencies([pending.assign(tf.where(raised, out["flags"], pending))]):
                figures = row(out, step.optimizer.iterations)
            return i + 1, upcoming, fetch, rows.write(i, figures), tf.logical_not(raised)

        go = tf.reduce_all(pending <= 0)
        start = (tf.constant(0), staged, tf.constant(True), rows, go)
        _, staged, valid, rows, _ = tf.while_loop(
            lambda i, staged, valid, rows, go: tf.logical_and(i < n, go), body, start,
            shape_invariants=(tf.TensorShape([]), step.staging.relaxed(staged),
                              tf.TensorShape([]), tf.TensorShape(None), tf.TensorShape([])))
        return rows.stack(), staged, valid

    concrete = []

    def call(iterator, staged, flags, n, more):
        # Traced once, for batches of any shape (a trace per new shape would build the
        # whole step's graph again).
        if not concrete:
            step.prepare(iterator.element_spec)
            specs = tf.nest.map_structure(
                lambda t: tf.TensorSpec([None] * t.shape.rank, t.dtype), staged)
            concrete.append(loop.get_concrete_function(
                iterator, specs, tf.TensorSpec([3], tf.float32), tf.TensorSpec([], tf.int32),
                tf.TensorSpec([], tf.bool)))
        return concrete[0](iterator, staged, flags, n, more)

    return call


class Calls:
    """The loop's calls and what the host holds between two syncs: the rows not yet
    read, and the staged batches (tensors on the devices, never read but to save).

    `fn`: `make_loop`'s call, or with --compile_step the step's `step_fn()`
    (CompiledStep: one step per call, its batches taken in Python)."""

    def __init__(self, step, fn: Callable, pending: tf.Variable, iterator, staged):
        self.step, self.fn, self.pending, self.iterator = step, fn, pending, iterator
        train = step.config.train
        self.compiled, self.steps_per_call = train.compile_step, train.steps_per_call
        # mixed_float16 may skip a step without advancing the count, and compile_step
        # takes its batches in Python: both read the device after every call.
        self.every_call = self.compiled or isinstance(step.optimizer,
                                                      keras.optimizers.LossScaleOptimizer)
        self.window: list[tf.Tensor] = []
        if self.compiled:
            self.staged, self.valid = None, False
        else:
            self.staged = staged if staged is not None else step.staging.fetch(iterator)
            self.valid = tf.constant(True)

    def sync_points(self, flags_fn: Callable[[], np.ndarray], step: int, max_steps: int,
                    sync_every: tuple[int, ...]) -> Iterator[tuple[np.ndarray, int | None]]:
        """Runs the steps after `step` up to `max_steps`, up to steps_per_call per call, and
        yields at each sync (policies.next_sync_step; every call with `every_call`) the
        rows read there and the step before them (None unless `every_call`): `account`'s
        arguments. `flags_fn()` -> this worker's flags [3] float32 before each call. Flags
        agreed at a sync are cleared when the consumer asks for the next one."""
        while step < max_steps:
            end = next_sync_step(step, max_steps, sync_every)
            n = min(self.steps_per_call, end - step)
            self.run(flags_fn(), n, more=step + n < max_steps)
            step += n  # as far as the host knows: a set flag stops the device early
            if not (self.every_call or step == end):
                continue
            rows = self.read()
            yield rows, step - n if self.every_call else None
            step = int(rows[-1, STATS.index("iterations")])
            if (rows[-1, FLAGS] > 0).any():
                self.pending.assign(tf.zeros([3]))

    def run(self, flags: np.ndarray, n: int, more: bool) -> None:
        if self.compiled:
            out = self.fn(self.iterator, tf.constant(flags))
            self.window.append(tf.expand_dims(row(out, self.step.optimizer.iterations), 0))
            return
        rows, self.staged, self.valid = self.fn(self.iterator, self.staged, tf.constant(flags),
                                                tf.constant(n), tf.constant(more))
        self.window.append(rows)

    def read(self) -> np.ndarray:
        """Every row since the last read, in one device-to-host copy."""
        rows = tf.concat(self.window, axis=0).numpy()
        self.window = []
        return rows

    def staged_for_save(self):
        """The staged batches if they are the next step's (not after the last step)."""
        if self.compiled or not bool(self.valid):
            return None
        return self.staged


def account(rows: np.ndarray, reporter: ProgressReporter, max_steps: int, before: int | None,
            learning_rate: Callable[[], float], loss_scale: Callable[[], float | None],
            model_dir: ModelDir):
    """Reports the rows read at a sync; returns (step, loss, last skipped, agreed flags).

    `before`: the step before these rows when each call is read (a skipped step
    leaves the count unchanged), else None. NonFiniteLossError at a NaN/Inf loss."""
    previous, loss, skipped = before, math.nan, False
    for values in rows:
        out = dict(zip(STATS, values.tolist()))
        step = int(out["iterations"])
        if not math.isfinite(out["loss"]):
            raise NonFiniteLossError(
                f"loss is {out['loss']} at step {step}; stopping without saving, the last "
                f"good checkpoint is {model_dir.latest_checkpoint()}")
        skipped = previous is not None and step == previous
        if skipped:
            logging.warning("step %d skipped: gradients overflowed at loss scale %g",
                            step + 1, loss_scale())
        previous, loss = step, out["loss"]
        reporter.record(step, {k: out[k] for k in STATS[:5]}, skipped, learning_rate,
                        loss_scale, force=step == max_steps and not skipped)
    return step, loss, skipped, rows[-1, FLAGS] > 0
