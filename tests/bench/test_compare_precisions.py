"""The side-by-side harness's precisions: the CPU's matrix units, our dtypes, CTranslate2's
fastest compute type, and their report lines; the trainings that receive them."""

import argparse
import json
import os

import pytest

from bench.compare import precisions, report, trainings

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
    decode = {"ctranslate2_float32": {"sentences_per_sec": 40.0, "latency_p50_ms": 9.0},
              "ctranslate2_int8": {"sentences_per_sec": 70.0, "latency_p50_ms": 11.0},
              "opennmt_savedmodel": {"sentences_per_sec": 99.0, "latency_p50_ms": 1.0}}
    assert precisions.fastest_peer(decode, "sentences_per_sec") == ("ctranslate2_int8", 70.0)
    assert precisions.fastest_peer(decode, "latency_p50_ms") == ("ctranslate2_float32", 9.0)
    assert precisions.fastest_peer({"ctranslate2_int8": None}, "latency_p50_ms") is None


def _figures():
    """A fake run's figures: bfloat16 primary, a float32 training, OpenNMT-tf."""
    def decoded(sentences, p50, bleu):
        return {"sentences_per_sec": sentences, "latency_p50_ms": p50, "bleu_of_this_decoder": bleu,
                "target_tokens_per_sec": 10 * sentences, "latency_p99_ms": 2 * p50,
                "process_peak_rss_mb": 900.0}

    return {
        "cpu": AMX, "common_tokens": {"ours": 0.5, "opennmt": 1.0},
        "ours": {"dtype": "mixed_bfloat16", "tokens_per_sec": 6000.0, "test_bleu": 30.1, "mfu": 0.2},
        "ours_float32": {"dtype": "float32", "tokens_per_sec": 4000.0, "test_bleu": 30.0,
                         "tokens_per_step": 7000.0, "peak_rss_mb": 2000.0, "mfu": 0.1},
        "opennmt": {"tokens_per_sec": 2000.0, "test_bleu": 25.0, "mfu": 0.1,
                    "tokens_per_step": 3500.0, "peak_rss_mb": 1000.0},
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


def test_train_both_trains_opennmt_and_each_of_our_dtypes(tmp_path, monkeypatch):
    calls = []

    def train_opennmt(args, work, d, cpus=None):
        calls.append(("opennmt", cpus))
        return {"model_dir": os.path.join(work, "opennmt"), "tokens_per_sec": 3000.0}

    def train_ours(args, work, d, cpus=None, dtype="float32", name="ours"):
        calls.append(("ours", name, dtype))
        return {"dtype": dtype, "model_dir": os.path.join(work, precisions.OURS_MODEL_DIRS[dtype])}

    monkeypatch.setattr(trainings, "train_opennmt", train_opennmt)
    monkeypatch.setattr(trainings, "train_ours", train_ours)
    args = argparse.Namespace(skip="", concurrent=False, minutes=25.0)
    ours = precisions.ours_trainings("auto", "float32,mixed_bfloat16", AMX)
    results = trainings.train_both(args, str(tmp_path), {}, ours=ours)
    assert calls == [("opennmt", None), ("ours", "ours_float32", "float32"),
                     ("ours", "ours", "mixed_bfloat16")]
    assert results["opennmt"]["tokens_per_sec"] == 3000.0
    assert results["ours"]["model_dir"].endswith("ours_bf16")
    assert results["ours_float32"]["model_dir"] == os.path.join(str(tmp_path), "ours")
    calls.clear()  # a skipped system does not train
    args.skip = "opennmt"
    results = trainings.train_both(args, str(tmp_path), {}, ours=[("ours", "float32")])
    assert calls == [("ours", "ours", "float32")] and "opennmt" not in results


def test_the_dtype_reaches_our_trainer_and_the_schedule_opennmt_tf(tmp_path, monkeypatch):
    commands = []

    def run_logged(command, log_path, env=None, cpus=None):
        commands.append((command, os.path.basename(log_path)))
        if "tf_transformer.train" in command:
            model_dir = next(c.split("=", 1)[1] for c in command if c.startswith("--model_dir="))
            os.makedirs(model_dir, exist_ok=True)
            dtype = [c for c in command if c.startswith("--dtype=")][-1].split("=", 1)[1]
            with open(os.path.join(model_dir, "config.json"), "w") as f:
                json.dump({"train": {"dtype": dtype, "warmup_steps": 400, "learning_rate_scale": 1.0},
                           "model": {"pre_norm": True}}, f)
        return [], 100.0, 0

    monkeypatch.setattr(trainings, "run_logged", run_logged)
    args = argparse.Namespace(minutes=1.0, corpus_dir="/c")
    d = {"data": str(tmp_path), "onmt_vocab": "v", "vocab": "sp.model"}
    r = trainings.train_ours(args, str(tmp_path), d, dtype="mixed_bfloat16", name="ours")
    command, log = commands[-1]
    assert "--dtype=mixed_bfloat16" in command and log == "ours_train.log"
    assert command[-1] == "--dtype=mixed_bfloat16"  # after the recipe's flagfile, so it wins
    assert r["dtype"] == "mixed_bfloat16" and r["model_dir"] == os.path.join(str(tmp_path), "ours_bf16")
    assert r["schedule"] == {"warmup_steps": 400, "learning_rate_scale": 1.0, "pre_norm": True}
    r = trainings.train_opennmt(args, str(tmp_path), d)
    command, log = commands[-1]
    assert command[2] == "1.0" and command[-1] == "train" and log == "opennmt_train.log"
    with open(tmp_path / "opennmt_run.yml") as f:  # JSON is YAML
        run = json.load(f)
    assert run["params"]["decay_params"]["warmup_steps"] == trainings.OPENNMT_SCHEDULE["warmup_steps"]
    assert r["setting"] == trainings.OPENNMT_SETTING and r["schedule"]["pre_norm"]


def test_pieces_files_hold_one_line_of_pieces_per_sentence(tmp_path):
    from bench.compare.scoring import write_pieces

    class Pieces:  # a SentencePiece processor's encode, one piece per character
        @staticmethod
        def encode(text, out_type=str):
            return ["\u2581" + text[0]] + list(text[1:])

    path = write_pieces(str(tmp_path / "test.en.sp"), Pieces(), ["ab", "c"])
    assert path == str(tmp_path / "test.en.sp")
    assert (tmp_path / "test.en.sp").read_text(encoding="utf-8") == "\u2581a b\n\u2581c\n"


def test_run_logged_keeps_each_line_with_its_time_and_the_exit_status(tmp_path):
    import sys

    from bench.compare.train_logs import read_logged

    code = "import sys; print('step=1', flush=True); print('step=2', file=sys.stderr); sys.exit(3)"
    lines, _, rc = trainings.run_logged([sys.executable, "-c", code], str(tmp_path / "run.log"),
                                        env={"EXTRA": "1"})
    assert rc == 3 and [line for _, line in lines][:2] == ["step=1", "step=2"]
    assert all(t >= 0 for t, _ in lines)
    assert [line for _, line in read_logged(str(tmp_path / "run.log"))][:2] == ["step=1", "step=2"]
