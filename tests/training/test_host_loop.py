"""The host runs ahead on 2 logical devices: no device-to-host read between sync steps,
N steps per call equal one per call, the staged batches resume exactly (dropout on), a
flag stops the device at once, and the XLA replica step is traced once for both
replicas and equals the plain one. (Two localhost workers: test_gpu_path_workers.py.)"""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import ops
from trainer_fixtures import MODEL, STEPS, dataset_of, train_config, weights_but_key_biases

from tf_transformer.training.trainer import Trainer

BATCHES = [b for pair in STEPS for b in pair]  # 3 steps of 2 replicas, 3 shapes
DROPOUT = dataclasses.replace(MODEL, dropout=0.3)


def _trainer(path, strategy, model=DROPOUT, **train):
    config = train_config(**train).replace(model=model)
    return Trainer(config, str(path), strategy)


def _mirrored():
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


class _Recorder:
    """Marks each loop call's start and end and every device-to-host read between."""

    def __init__(self, trainer):
        self.events, self._loop = [], trainer.loop_fn()
        trainer._loop_fn = self._call

    def _call(self, *args):
        self.events.append("call")
        try:
            return self._loop(*args)
        finally:
            self.events.append("end")

    def reads_after_each_call(self) -> list[int]:
        """Reads between the end of call k and the start of call k + 1, for each k."""
        counts = []
        for event in self.events:
            if event == "end":
                counts.append(0)
            elif event == "read" and counts:
                counts[-1] += 1
        return counts


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """6 steps, one per call, on 2 replicas with dropout; reads recorded (syncs at 3, 6)."""
    trainer = _trainer(tmp_path_factory.mktemp("straight"), _mirrored(), log_every=3)
    recorder = _Recorder(trainer)
    numpy = ops._EagerTensorBase._numpy

    def recorded(tensor):
        if recorder.events and recorder.events[-1] != "call":
            recorder.events.append("read")
        return numpy(tensor)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ops._EagerTensorBase, "_numpy", recorded)
        result = trainer.train(dataset_of(BATCHES), max_steps=6, log_fn=lambda line: None)
    return trainer, result, recorder


def test_the_host_reads_the_device_only_at_sync_steps(straight):
    _, result, recorder = straight
    reads = recorder.reads_after_each_call()
    assert result.step == 6 and len(reads) == 6  # one call per step
    assert [step for step, n in enumerate(reads, start=1) if n] == [3, 6], reads


class _Preempted(Exception):
    pass


def _preempt(model):
    """An evaluation at the first checkpoint that ends the run, as a preemption would."""
    raise _Preempted


def _forget(trainer):
    """A trainer as a new process would start it before restoring: every checkpointed
    variable (weights, Adam's slots and step count) zeroed, so only the checkpoint can give
    them back. (The same trainer, not a new one: its traced loop is reused.)"""
    for variable in trainer.model.weights + trainer.optimizer.variables:
        variable.assign(tf.zeros_like(variable))
    assert trainer.step == 0


def test_n_steps_per_call_then_resume_equal_one_step_per_call(straight, tmp_path):
    """3 steps in one call and a checkpoint, whose input position holds the next step's
    batches already staged on the devices; the run dies; the trainer, its state forgotten,
    resumes for 3 more steps in one call: the weights of 6 steps one per call."""
    one, _, _ = straight
    path = tmp_path / "n_per_call"
    first = _trainer(path, _mirrored(), log_every=100, steps_per_call=4, checkpoint_steps=3)
    with pytest.raises(_Preempted):
        first.train(dataset_of(BATCHES), max_steps=6, evaluate_fn=_preempt,
                    log_fn=lambda line: None)
    saved = tf.train.load_checkpoint(str(path / "input" / "worker_0" / "input-3"))
    staged = saved.get_tensor("staged/.ATTRIBUTES/VARIABLE_VALUE")
    assert len(staged) == 2 * 3  # 2 replicas x (source, target_in, target_out)
    resumed = first
    _forget(resumed)
    result = resumed.train(dataset_of(BATCHES), max_steps=6, log_fn=lambda line: None)
    assert result.step == 6 == resumed.step and resumed.inputs.restored_step == 3
    for a, b in zip(weights_but_key_biases(resumed), weights_but_key_biases(one)):
        np.testing.assert_allclose(a, b, atol=2e-5)


def test_a_flag_stops_after_the_step_that_carried_it(tmp_path):
    """The spent budget rides the first step's all-reduce: the device stops after it, in the
    middle of a call of 4 steps, and the next calls run nothing until the host, reading at
    its next sync, acts on it. (One step per call takes no path this does not: the flag's
    step ends its call and the later calls run nothing.)"""
    trainer = _trainer(tmp_path, tf.distribute.OneDeviceStrategy("/cpu:0"), log_every=100,
                       steps_per_call=4)
    result = trainer.train(dataset_of(BATCHES), max_steps=50, max_minutes=0.0,
                           log_fn=lambda line: None)
    assert (result.step, result.stopped_by, trainer.step) == (1, "max_minutes", 1)
    assert result.checkpoint.endswith("ckpt-1")


def test_xla_replica_step_traced_once_for_both_replicas_equals_plain(tmp_path):
    """--jit_compile on 2 replicas: one trace of the forward and backward pass serves both
    replicas and every batch shape, with no data-dependent shape in it, and each replica's
    compiled gradients, loss and tokens equal the plain step's on its own batch. (Dropout
    off: XLA's stateless random numbers differ from TensorFlow's kernels'.)"""
    mirrored = _mirrored()
    trainer = _trainer(tmp_path, mirrored, model=MODEL, log_every=3, jit_compile=True)
    assert not trainer.step_policy.gather_targets
    # 1 step: a batch of its own shape on each replica (each an XLA compilation on its
    # device), both through the one trace; the pair compared below, whose compilations
    # are then cached.
    assert trainer.train(dataset_of(BATCHES), max_steps=1, log_fn=lambda line: None).step == 1
    compiled = trainer.train_step.replica_grads
    assert compiled.traces == 1
    assert not {"Where", "GatherNd"} & {op.type for op in compiled.graph.get_operations()}

    @tf.function(autograph=False)
    def both(batches):
        def replica(batch):
            key = trainer.train_step.dropout_key(0)
            return compiled(batch, key), trainer.train_step.grads(batch, key)
        return mirrored.run(replica, args=(batches,))

    # The first step's pair: a batch of its own shape on each replica.
    batches = mirrored.experimental_distribute_values_from_function(
        lambda ctx: {k: tf.constant(v) for k, v in STEPS[0][ctx.replica_id_in_sync_group].items()})
    got, want = both(batches)
    for xla, plain in zip(mirrored.experimental_local_results(got),
                          mirrored.experimental_local_results(want)):
        assert float(xla[2]) == float(plain[2])  # target tokens
        np.testing.assert_allclose(float(xla[1]), float(plain[1]), rtol=1e-5)
        for g, w in zip(xla[0], plain[0]):
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-4, atol=1e-5)
    assert compiled.traces == 1
