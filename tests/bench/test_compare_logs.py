"""The side-by-side harness reads both trainers' logs: each field from its own place."""

import os

from bench.compare import dev_curves, train_logs
from compare_fixtures import fake_modules, load_opennmt_train

ONMT = [
    "2026-11-25 20:25:49.168000: I runner.py:310] Step = 25 ; steps/s = 0.94, tokens/s = 6563 "
    "(3060 source, 3503 target) ; Learning rate = 0.000006 ; Loss = 8.941279",
    "2026-11-25 20:26:15.916000: I runner.py:310] Step = 50 ; steps/s = 0.50, tokens/s = 6000 "
    "(3000 source, 3000 target) ; Learning rate = 0.000013 ; Loss = 8.821073",
    "2026-11-25 20:27:00.000000: I runner.py:310] Evaluation result for step 50: loss = 7.5 ; ",
]
OURS = [
    "step=25 loss=8.22737 lr=2.031e-04 tokens_per_sec=5177 tokens_per_sec_per_replica=5177 "
    "ms_per_step=1335.2 grad_norm=0.930 skipped_steps=0 model_tflops=0.1413",
    "step=50 loss=7.17289 lr=3.984e-04 tokens_per_sec=6000 tokens_per_sec_per_replica=6000 "
    "ms_per_step=1000.0 grad_norm=0.759 skipped_steps=0 model_tflops=0.1806",
    "eval step=50 dev_loss=6.25 dev_bleu=1.5",
]


def test_opennmt_log():
    got = train_logs.parse_opennmt_train(list(zip((43.0, 69.7, 90.0), ONMT)))
    assert got["curve_train"] == [(43.0, 8.941279), (69.7, 8.821073)]
    assert got["curve_dev"] == [(90.0, 7.5)]
    assert got["tokens_per_sec"] == 6000  # the windows after the first
    assert got["tokens_per_step"] == 12000  # tokens/s over steps/s
    assert got["last_step"] == 50


def test_our_log_and_its_timestamped_copy(tmp_path):
    lines = list(zip((39.1, 65.4, 80.0), OURS))
    got = train_logs.parse_ours_train(lines)
    assert got["curve_train"] == [(39.1, 8.22737), (65.4, 7.17289)]
    assert got["curve_dev"] == [(80.0, 6.25)]
    assert got["tokens_per_sec"] == 6000 and got["tokens_per_step"] == 6000
    log = tmp_path / "ours_train.log"
    log.write_text("".join(f"{t:9.1f} {line}\n" for t, line in lines) + "no time here\n")
    assert train_logs.read_logged(str(log)) == lines


def test_dev_curve_times_each_checkpoint_by_its_logged_save():
    lines = [(20.7, "2026-11-26 08:31:39.051000: I training.py:176] Saved checkpoint run/ckpt-250"),
             (600.0, "I1126 07:50:29.479760 1399 trainer.py:131] saved checkpoint /m/ckpt-540"),
             (300.0, "2026-11-26 08:36:00.000000: I training.py:176] Saved checkpoint run/ckpt-1")]
    seconds = dev_curves.checkpoint_seconds(lines)
    assert seconds == {"ckpt-250": 20.7, "ckpt-540": 600.0, "ckpt-1": 300.0}
    scores = {"/a/ckpt-540": 9.0, "/a/ckpt-1": 1.0, "/a/ckpt-250": 5.0, "/a/ckpt-9": 7.0}
    # In time order; ckpt-9's saving was not logged, so it has no minute.
    assert dev_curves.curve(list(scores), seconds, scores.get) == [
        (20.7, 5.0), (300.0, 1.0), (600.0, 9.0)]


def test_protocol_trains_opennmt_with_the_best_setting_of_its_sweep():
    from bench.compare import trainings

    assert trainings.OPENNMT_SETTING == "onmt_w1600_pre"  # bench/results/quality.md
    # Not the paper's warmup, which never ends in 25 minutes; pre-norm in its model file.
    assert trainings.OPENNMT_SCHEDULE == {"warmup_steps": 1600, "pre_norm": True}
    with open(os.path.join(trainings.HERE, "opennmt_model.py")) as f:
        assert "pre_norm=True" in f.read()


def test_both_systems_train_the_same_architecture():
    # The recipe pins the protocol's 3+3 layers; the FLOP count (one for both systems)
    # comes from it, and OpenNMT-tf's model file must build the same sizes.
    import re

    from bench.compare import trainings

    model = trainings.recipe_model(8000)
    with open(os.path.join(trainings.HERE, "opennmt_model.py")) as f:
        onmt = dict(re.findall(r"(num_layers|num_units|num_heads|ffn_inner_dim)=(\d+)", f.read()))
    assert (model.num_layers, model.d_model, model.num_heads, model.d_ff, model.vocab_size) == (
        int(onmt["num_layers"]), int(onmt["num_units"]), int(onmt["num_heads"]),
        int(onmt["ffn_inner_dim"]), 8000)


def test_a_skipped_system_keeps_its_earlier_training(tmp_path, capsys):
    # A 90-minute budget trains one system per session: the other's entry is kept.
    import json

    from bench.compare import report, trainings

    path = tmp_path / "training.json"
    assert trainings.earlier_trainings(str(path), ["opennmt"]) == {}
    earlier = {"ours": {"test_bleu": 30.0, "cpu": "Xeon"},
               "opennmt": {"test_bleu": 25.0, "cpu": "EPYC"}, "matmul_peak_flops": 1e11}
    path.write_text(json.dumps(earlier))
    assert trainings.earlier_trainings(str(path), ["opennmt", "decode"]) == {
        "opennmt": earlier["opennmt"]}
    assert trainings.earlier_trainings(str(path), [""]) == {}
    report.report({**earlier, "decode": {}, "common_tokens": {"ours": 1.0, "opennmt": 1.0}})
    assert "different CPUs" in capsys.readouterr().out


def test_the_c_clients_figures_leave_out_its_first_batch():
    from bench.compare.decode_benchmark import c_client_figures

    stderr = ("I0000 some log line\nc_client load_seconds=1.10 batches=3 batch_size=32 sentences=70 "
              "seconds=8.000 first_batch_seconds=6.000 sentences_per_sec=8.75\npeak_rss_kb=924000\n")
    figures = c_client_figures(stderr, "".join(f"line {i}\n" for i in range(70)))
    assert figures["sentences_per_sec"] == 38 / 2.0 and figures["timed_from"] == 32
    assert figures["whole_run_sentences_per_sec"] == 70 / 8.0
    assert round(figures["process_peak_rss_mb"]) == 902 and len(figures["translations"]) == 70
    one_batch = stderr.replace("sentences=70", "sentences=20")
    assert c_client_figures(one_batch, "")["sentences_per_sec"] == 20 / 8.0
    assert c_client_figures("translate: load: no such file\n", "") is None


def test_concurrent_trainings_get_a_core_each():
    from bench.compare import trainings

    assert trainings.core_assignment(False) == {"opennmt": None, "ours": None}
    if len(os.sched_getaffinity(0)) >= 2:
        cores = trainings.core_assignment(True)
        assert len(cores["opennmt"]) == len(cores["ours"]) == 1
        assert cores["opennmt"] != cores["ours"]


class _FakeTrainer:
    """What opennmt_train.py relies on in OpenNMT-tf 2.32.0's opennmt.training.Trainer."""

    def __call__(self, dataset, accum_steps=1):
        return [loss for loss in self._steps(dataset, accum_steps=accum_steps)]

    def _steps(self, dataset, accum_steps=1):
        yield from dataset


def _opennmt_train(monkeypatch, trainer, version="2.32.0"):
    """bench/compare/opennmt_train.py loaded on a fake OpenNMT-tf (its venv is not ours)."""
    from bench.compare import trainings

    fake = fake_modules("opennmt", "opennmt.training", "opennmt.bin", "opennmt.bin.main")
    fake["opennmt"].__version__ = version
    fake["opennmt"].training, fake["opennmt.bin"].main = fake["opennmt.training"], fake["opennmt.bin.main"]
    fake["opennmt.training"].Trainer = trainer
    module = load_opennmt_train(monkeypatch, fake)
    assert module.PATCH_ERROR == trainings.OPENNMT_PATCH_ERROR
    return module


def test_the_opennmt_deadline_ends_the_step_loop(monkeypatch, capsys):
    trainer = type("Trainer", (_FakeTrainer,), {})
    opennmt_train = _opennmt_train(monkeypatch, trainer)
    assert trainer()([1.0, 2.0, 3.0]) == [1.0, 2.0, 3.0]
    opennmt_train._with_deadline(0.0)  # already past after the first step
    assert trainer()([1.0, 2.0, 3.0]) == [1.0]
    assert capsys.readouterr().out == "stopped_by=max_minutes minutes=0.0\n"


def test_the_opennmt_patch_fails_loudly_on_a_changed_trainer(monkeypatch, capsys):
    import pytest

    class Renamed(_FakeTrainer):  # _steps gone
        _steps = None

    class Overridden(_FakeTrainer):
        pass

    class MultiDevice(Overridden):
        def _steps(self, dataset, accum_steps=1):
            yield from dataset

    for trainer, problem in ((Renamed, "Trainer has no attribute `_steps`"),
                             (Overridden, "_steps is overridden in MultiDevice")):
        opennmt_train = _opennmt_train(monkeypatch, trainer, version="2.33.0")
        with pytest.raises(SystemExit) as error:
            opennmt_train._with_deadline(1.0)
        message = str(error.value)
        assert message.startswith(opennmt_train.PATCH_ERROR + " (OpenNMT-tf 2.33.0): ")
        assert problem in message and "written against OpenNMT-tf 2.32.0" in message
    opennmt_train = _opennmt_train(monkeypatch, type("Trainer", (_FakeTrainer,), {}), "2.33.0")
    opennmt_train._with_deadline(1.0)  # it fits: a warning only
    assert "written against 2.32.0; its checks pass" in capsys.readouterr().out


def test_the_protocol_stops_when_the_opennmt_patch_does_not_fit(tmp_path, monkeypatch):
    import argparse

    import pytest

    from bench.compare import trainings

    error = trainings.OPENNMT_PATCH_ERROR + " (OpenNMT-tf 2.33.0): Trainer has no attribute `_steps`."
    monkeypatch.setattr(trainings, "run_logged",
                        lambda *args, **kwargs: ([(3.0, "I tensorflow"), (4.0, error)], 300.0, 1))
    d = {"data": str(tmp_path), "onmt_vocab": str(tmp_path / "vocab")}
    with pytest.raises(SystemExit, match="no attribute `_steps`"):
        trainings.train_opennmt(argparse.Namespace(minutes=1.0), str(tmp_path), d)
