"""The progress line a GPU user reads: tokens per replica, model FLOPs/s, MFU."""

import pytest
import tensorflow as tf
from trainer_fixtures import STEPS, concat_batches, dataset_of, train_config

from tf_transformer.model import flops
from tf_transformer.training import reporting
from tf_transformer.training.trainer import Trainer


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _fields(line):
    return dict(field.split("=") for field in line.split())


def test_line_divides_by_elapsed_time_replicas_and_peak():
    clock, lines = FakeClock(), []
    reporter = reporting.ProgressReporter(tf.summary.create_noop_writer(), lines.append,
                                          log_every=2, replicas=4, peak_tflops=100.0, clock=clock)
    out = {"loss": 2.0, "grad_norm": 1.0, "source_tokens": 300.0, "target_tokens": 100.0,
           "flops": 4e14}
    reporter.record(1, out, skipped=False, learning_rate=1e-3)
    clock.now = 1.0
    reporter.record(1, out, skipped=True, learning_rate=1e-3, loss_scale=1024.0)
    clock.now = 2.0
    assert not lines
    reporter.record(2, out, skipped=False, learning_rate=1e-3, loss_scale=1024.0)
    fields = _fields(lines[0])
    assert fields["tokens_per_sec"] == "600"  # 3 calls x 400 tokens / 2 s
    assert fields["tokens_per_sec_per_replica"] == "150"
    assert fields["ms_per_step"] == "666.7"  # the skipped call counts
    assert fields["skipped_steps"] == "1" and fields["loss_scale"] == "1024"
    assert fields["model_tflops"] == "600"  # 1.2e15 FLOPs / 2 s
    assert fields["mfu"] == "1.500"  # 600 / (100 x 4 replicas)


def test_known_peaks_by_device_name():
    assert reporting.peak_for("NVIDIA H100 80GB HBM3") == 989.0
    assert reporting.peak_for("NVIDIA A100-SXM4-40GB") == 312.0
    assert reporting.peak_for("Tesla T4") is None
    assert reporting.default_peak_tflops() is None  # this CPU: no MFU unless given


def test_trainer_counts_the_model_flops_of_its_batches(tmp_path):
    batches = [concat_batches(*pair) for pair in STEPS]
    lines = []
    trainer = Trainer(train_config(log_every=3), str(tmp_path),
                      tf.distribute.OneDeviceStrategy("/cpu:0"), peak_tflops=1e-6)
    trainer.train(dataset_of(batches), max_steps=3, log_fn=lines.append)
    fields = _fields(lines[0])
    total = sum(flops.train_step_flops(trainer.config.model, b["source"].shape[0],
                                       b["source"].shape[1], b["target_in"].shape[1])
                for b in batches)
    seconds = 3 * float(fields["ms_per_step"]) / 1000
    assert float(fields["model_tflops"]) * 1e12 * seconds == pytest.approx(
        total, rel=0.02)
    assert float(fields["mfu"]) == pytest.approx(
        float(fields["model_tflops"]) / 1e-6, rel=0.01)
