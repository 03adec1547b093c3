"""The side-by-side harness's precisions: the CPU's matrix units, our dtypes, OpenNMT-tf's
faster precision by probe, CTranslate2's fastest compute type, and their report lines."""

import argparse
import json
import os

import pytest

from bench.compare import precisions, report, trainings
from compare_fixtures import fake_modules, load_opennmt_train

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 avx512_fp16 amx_tile amx_int8

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx2
"""
AMX = {"model": "Xeon", "matrix_units": ["amx_bf16", "amx_int8", "avx512_bf16"]}
AVX2 = {"model": "EPYC", "matrix_units": []}


def test_the_cpus_matrix_units_come_from_the_first_processors_flags():
    cpu = precisions.parse_cpuinfo(CPUINFO)
    assert cpu == {"model": "Intel(R) Xeon(R) Platinum 8480+",
                   "matrix_units": ["amx_bf16", "amx_int8", "avx512_bf16", "avx512_fp16", "avx512_vnni"]}
    assert precisions.cpu_line(cpu) == ('cpu model="Intel(R) Xeon(R) Platinum 8480+" '
                                        'matrix_units=amx_bf16,amx_int8,avx512_bf16,avx512_fp16,avx512_vnni')
    assert precisions.parse_cpuinfo("") == {"model": "", "matrix_units": []}
    assert precisions.cpu_line(AVX2) == 'cpu model="EPYC" matrix_units=none'
    assert precisions.read_cpuinfo("/no/such/file") == {"model": "", "matrix_units": []}


def test_our_dtypes_are_bfloat16_where_the_cpu_has_amx_bfloat16():
    assert precisions.ours_dtype("auto", AMX) == "mixed_bfloat16"
    assert precisions.ours_dtype("auto", AVX2) == "float32"
    assert precisions.ours_dtype("float32", AMX) == "float32"
    with pytest.raises(ValueError):
        precisions.ours_dtype("mixed_float16", AMX)
    # The primary is "ours"; the others are named by their dtype, in training order.
    assert precisions.ours_trainings("auto", "", AMX) == [("ours", "mixed_bfloat16")]
    assert precisions.ours_trainings("auto", "float32,mixed_bfloat16", AMX) == [
        ("ours_float32", "float32"), ("ours", "mixed_bfloat16")]
    assert precisions.ours_trainings("auto", "mixed_bfloat16", AVX2) == [
        ("ours", "float32"), ("ours_mixed_bfloat16", "mixed_bfloat16")]
    assert precisions.ours_trainings("float32", "auto,float32", AMX) == [
        ("ours_mixed_bfloat16", "mixed_bfloat16"), ("ours", "float32")]
    # Each dtype has its own model directory, float32 the one it always had.
    assert precisions.OURS_MODEL_DIRS == {"float32": "ours", "mixed_bfloat16": "ours_bf16"}
    assert precisions.export_dtypes("auto", AMX) == ["float32", "bfloat16"]
    assert precisions.export_dtypes("auto", AVX2) == ["float32"]
    assert precisions.export_dtypes("bfloat16", AVX2) == ["bfloat16"]
    with pytest.raises(ValueError):
        precisions.export_dtypes("float16", AMX)


def test_the_faster_peer_setting_is_chosen():
    assert precisions.fastest({"float32": 3000.0, "mixed": 450.0}) == "float32"
    assert precisions.fastest({"float32": 3000.0, "mixed": 3500.0}) == "mixed"
    assert precisions.fastest({"float32": 3000.0, "mixed": None}) == "float32"  # no window logged
    assert precisions.fastest({"float32": None}) is None
    assert precisions.opennmt_precision("auto", {"float32": 3000.0, "mixed": 450.0}) == ("float32", "probe")
    assert precisions.opennmt_precision("mixed", {"float32": 3000.0}) == ("mixed", "flag")
    assert precisions.opennmt_precision("auto", {}) == ("float32", "default, no probe figure")
    decode = {"ctranslate2_float32": {"sentences_per_sec": 40.0, "latency_p50_ms": 9.0},
              "ctranslate2_int8": {"sentences_per_sec": 70.0, "latency_p50_ms": 11.0},
              "opennmt_savedmodel": {"sentences_per_sec": 99.0, "latency_p50_ms": 1.0}}
    assert precisions.fastest_peer(decode, "sentences_per_sec") == ("ctranslate2_int8", 70.0)
    assert precisions.fastest_peer(decode, "latency_p50_ms") == ("ctranslate2_float32", 9.0)
    assert precisions.fastest_peer({"ctranslate2_int8": None}, "latency_p50_ms") is None


def _figures():
    """A fake run's figures: bfloat16 primary, a float32 training, OpenNMT-tf probed."""
    def decoded(sentences, p50, bleu):
        return {"sentences_per_sec": sentences, "latency_p50_ms": p50, "bleu_of_this_decoder": bleu,
                "target_tokens_per_sec": 10 * sentences, "latency_p99_ms": 2 * p50,
                "process_peak_rss_mb": 900.0}

    return {
        "cpu": AMX, "common_tokens": {"ours": 0.5, "opennmt": 1.0},
        "ours": {"dtype": "mixed_bfloat16", "tokens_per_sec": 6000.0, "test_bleu": 30.1, "mfu": 0.2},
        "ours_float32": {"dtype": "float32", "tokens_per_sec": 4000.0, "test_bleu": 30.0,
                         "tokens_per_step": 7000.0, "peak_rss_mb": 2000.0, "mfu": 0.1},
        "opennmt": {"tokens_per_sec": 2000.0, "test_bleu": 25.0, "precision": "float32",
                    "precision_chosen_by": "probe", "mixed_float16": False, "mfu": 0.1,
                    "tokens_per_step": 3500.0, "peak_rss_mb": 1000.0,
                    "precision_probe": {
                        "float32": {"tokens_per_sec": 2100.0, "last_step": 60, "minutes": 2.0},
                        "mixed": {"tokens_per_sec": None, "last_step": 0, "minutes": 2.0,
                                  "mixed_float16": True, "stopped_by_timeout": True}}},
        "decode": {"ours_savedmodel": decoded(20.0, 50.0, 30.0),
                   "ours_savedmodel_1thread": decoded(25.0, 60.0, 30.0),
                   "ours_savedmodel_bf16": decoded(40.0, 30.0, 29.8),
                   "ours_savedmodel_bf16_1thread": decoded(45.0, 35.0, 29.5),
                   "ctranslate2_float32": decoded(30.0, 20.0, 30.2),
                   "ctranslate2_int8": decoded(50.0, 25.0, 29.9)},
    }


def test_the_report_prints_the_precision_rows(capsys):
    report.report(_figures())
    out = capsys.readouterr().out.splitlines()
    assert out[0] == 'cpu model="Xeon" matrix_units=amx_bf16,amx_int8,avx512_bf16'
    for expected in [
        "opennmt_probe float32: tokens_per_sec=2100 steps=60 minutes=2.0",
        "opennmt_probe mixed: tokens_per_sec=None steps=0 minutes=2.0 mixed_float16=on "
        "(no throughput line: stopped at its timeout, counted as the slower)",
        "opennmt_precision: float32 (chosen by probe)",
        "train_dtype: ours=mixed_bfloat16 ours_float32=float32 opennmt=float32",
        # The existing lines keep their names; the float32 run has its own.
        "train_tokens_per_sec (own count): ours=6000.00 opennmt=2000.00 ratio=3.00",
        "train_tokens_per_sec (own count) [ours_float32]: ours_float32=4000.00 opennmt=2000.00 ratio=2.00",
        "train_real_tokens_per_step (common count) [ours_float32]: ours_float32=3500.00 opennmt=3500.00 ratio=1.00",
        "test_bleu: ours=30.1 opennmt=25.0 difference=5.10",
        "test_bleu [ours_float32]: ours_float32=30.0 opennmt=25.0 difference=5.00",
        "test_bleu_by_dtype: mixed_bfloat16=30.1 float32=30.0 difference=0.10 "
        "(target: the mixed_bfloat16 run not below the float32 run: met)",
        "decode sentences_per_sec: ours_savedmodel_bf16=40.00 ctranslate2_int8=50.00 ratio=0.80",
        # Against CTranslate2's fastest compute type per figure, named.
        "decode sentences_per_sec vs fastest ctranslate2: ours_savedmodel_bf16=40.00 ctranslate2_int8=50.00 ratio=0.80",
        "decode latency_p50_ms vs fastest ctranslate2: ours_savedmodel_bf16=30.00 ctranslate2_float32=20.00 ratio=1.50",
        "decode sentences_per_sec vs fastest ctranslate2: ours_savedmodel=20.00 ctranslate2_int8=50.00 ratio=0.40",
        "decode bleu_of_every_export: ours_savedmodel=30.00 ours_savedmodel_1thread=30.00 "
        "ours_savedmodel_bf16=29.80 ours_savedmodel_bf16_1thread=29.50 ctranslate2_float32=30.20 "
        "ctranslate2_int8=29.90",
        "decode bleu bfloat16 vs float32: ours_savedmodel_bf16=29.80 ours_savedmodel=30.00 "
        "difference=-0.20 (target: within 0.3: met)",
        "decode bleu bfloat16 vs float32: ours_savedmodel_bf16_1thread=29.50 "
        "ours_savedmodel_1thread=30.00 difference=-0.50 (target: within 0.3: not met)"]:
        assert expected in out, expected


def test_a_run_without_bfloat16_prints_no_bfloat16_rows(capsys):
    figures = dict(_figures(), cpu=AVX2)
    del figures["ours_float32"]
    figures["ours"]["dtype"] = "float32"
    figures["decode"] = {k: v for k, v in figures["decode"].items() if "bf16" not in k}
    report.report(figures)
    out = capsys.readouterr().out
    assert "bf16" not in out and "test_bleu_by_dtype" not in out and "[ours_" not in out
    assert "train_dtype: ours=float32 opennmt=float32" in out


def test_skipping_ours_keeps_every_one_of_our_earlier_trainings(tmp_path):
    path = tmp_path / "training.json"
    earlier = {"ours": {"dtype": "mixed_bfloat16", "model_dir": "/w/ours_bf16"},
               "ours_float32": {"dtype": "float32", "model_dir": "/w/ours"},
               "opennmt": {"test_bleu": 25.0}, "matmul_peak_flops": 1e11}
    path.write_text(json.dumps(earlier))
    assert trainings.earlier_trainings(str(path), ["ours"]) == {
        "ours": earlier["ours"], "ours_float32": earlier["ours_float32"]}
    assert report.training_keys(earlier) == ["ours", "ours_float32", "opennmt"]


def test_train_both_probes_opennmt_and_trains_each_of_our_dtypes(tmp_path, monkeypatch):
    calls = []

    def train_opennmt(args, work, d, name="opennmt", schedule=None, cpus=None, precision="float32",
                      minutes=None, log_every=None, timeout=None):
        calls.append(("opennmt", name, precision, minutes))
        if minutes:  # a probe: short windows, stopped if it runs far past its budget
            assert log_every == trainings.PROBE_LOG_EVERY
            assert timeout == 60 * minutes + trainings.PROBE_GRACE_SECONDS
        os.makedirs(os.path.join(work, name), exist_ok=True)
        speed = {"float32": 3000.0, "mixed": 400.0}[precision]
        return {"model_dir": os.path.join(work, name), "tokens_per_sec": speed, "last_step": 50,
                "peak_rss_mb": 1.0, "mixed_float16": precision == "mixed", "stopped_by_timeout": False,
                "train_log": name + ".log", "precision": precision}

    def train_ours(args, work, d, cpus=None, dtype="float32", name="ours"):
        calls.append(("ours", name, dtype))
        return {"dtype": dtype, "model_dir": os.path.join(work, precisions.OURS_MODEL_DIRS[dtype])}

    monkeypatch.setattr(trainings, "train_opennmt", train_opennmt)
    monkeypatch.setattr(trainings, "train_ours", train_ours)
    args = argparse.Namespace(skip="", concurrent=False, minutes=25.0, opennmt_precision="auto",
                              opennmt_probe_minutes=2.0)
    ours = precisions.ours_trainings("auto", "float32,mixed_bfloat16", AMX)
    results = trainings.train_both(args, str(tmp_path), {}, {}, ours=ours)
    assert calls == [("opennmt", "opennmt_probe_float32", "float32", 2.0),
                     ("opennmt", "opennmt_probe_mixed", "mixed", 2.0),
                     ("opennmt", "opennmt", "float32", None),
                     ("ours", "ours_float32", "float32"), ("ours", "ours", "mixed_bfloat16")]
    assert not os.path.exists(tmp_path / "opennmt_probe_mixed")  # a probe leaves no model
    assert results["opennmt"]["precision_chosen_by"] == "probe"
    assert results["opennmt"]["precision_probe"]["mixed"]["tokens_per_sec"] == 400.0
    assert results["ours"]["model_dir"].endswith("ours_bf16")
    assert results["ours_float32"]["model_dir"] == os.path.join(str(tmp_path), "ours")
    calls.clear()  # an explicit precision needs no probe
    args.opennmt_precision = "mixed"
    results = trainings.train_both(args, str(tmp_path), {}, {}, ours=[("ours", "float32")])
    assert calls == [("opennmt", "opennmt", "mixed", None), ("ours", "ours", "float32")]
    assert results["opennmt"]["precision_chosen_by"] == "flag"


def test_the_precisions_reach_each_trainer(tmp_path, monkeypatch):
    commands = []

    def run_logged(command, log_path, env=None, cpus=None, timeout=None):
        commands.append((command, env, os.path.basename(log_path)))
        if "tf_transformer.train" in command:
            model_dir = next(c.split("=", 1)[1] for c in command if c.startswith("--model_dir="))
            os.makedirs(model_dir, exist_ok=True)
            dtype = [c for c in command if c.startswith("--dtype=")][-1].split("=", 1)[1]
            with open(os.path.join(model_dir, "config.json"), "w") as f:
                json.dump({"train": {"dtype": dtype, "warmup_steps": 400, "learning_rate_scale": 1.0},
                           "model": {"pre_norm": True}}, f)
            return [], 100.0, 0
        return [(1.0, "mixed_precision=forced (mixed_float16 on the CPU)")], 100.0, 0

    monkeypatch.setattr(trainings, "run_logged", run_logged)
    args = argparse.Namespace(minutes=1.0, corpus_dir="/c", ours_flags="")
    d = {"data": str(tmp_path), "onmt_vocab": "v", "vocab": "sp.model"}
    r = trainings.train_ours(args, str(tmp_path), d, dtype="mixed_bfloat16", name="ours")
    command, _, log = commands[-1]
    assert "--dtype=mixed_bfloat16" in command and log == "ours_train.log"
    assert r["dtype"] == "mixed_bfloat16" and r["model_dir"] == os.path.join(str(tmp_path), "ours_bf16")
    r = trainings.train_opennmt(args, str(tmp_path), d, precision="mixed", minutes=0.5)
    command, env, _ = commands[-1]
    assert command[command.index("--mixed_precision") + 1] == "train" and command[2] == "0.5"
    assert env["OPENNMT_FORCE_MIXED_PRECISION"] == "1" and r["mixed_float16"]
    assert "OPENNMT_FORCE_MIXED_PRECISION" not in r["env"]  # infer and export stay float32
    trainings.train_opennmt(args, str(tmp_path), d)
    command, env, _ = commands[-1]
    assert "--mixed_precision" not in command and "OPENNMT_FORCE_MIXED_PRECISION" not in env
    assert not trainings.mixed_precision_enabled(
        [(1.0, "mixed_precision=forced"), (2.0, "W Mixed precision not enabled: no GPU is detected")])


def test_opennmt_train_forces_mixed_precision_on_the_cpu(monkeypatch, capsys):
    import types

    calls = []
    misc = types.ModuleType("opennmt.utils.misc")
    misc.enable_mixed_precision = lambda force=False: calls.append(force) or force
    fake = fake_modules("opennmt", "opennmt.training", "opennmt.bin", "opennmt.bin.main",
                        "opennmt.utils")
    fake["opennmt.utils.misc"] = misc
    fake["opennmt.utils"].misc = misc
    fake["opennmt"].utils = fake["opennmt.utils"]
    module = load_opennmt_train(monkeypatch, fake)
    module._force_mixed_precision()
    assert misc.enable_mixed_precision() is True and calls == [True]  # as OpenNMT-tf's runner calls it
    assert capsys.readouterr().out.startswith("mixed_precision=forced")


def test_run_logged_stops_a_process_at_its_timeout(tmp_path):
    import sys
    import time

    start = time.time()
    lines, _, rc = trainings.run_logged(
        [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"],
        str(tmp_path / "slow.log"), timeout=1.0)
    assert time.time() - start < 30 and rc != 0
    assert lines[0][1] == "started" and lines[-1][1].startswith(trainings.TIMEOUT_LINE)
    assert (tmp_path / "slow.log").read_text().rstrip().endswith(lines[-1][1])
    lines, _, rc = trainings.run_logged([sys.executable, "-c", "print('quick')"],
                                        str(tmp_path / "quick.log"), timeout=30.0)
    assert rc == 0 and not any(line.startswith(trainings.TIMEOUT_LINE) for _, line in lines)
