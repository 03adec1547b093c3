"""The protocol's two trainings, OpenNMT-tf's and ours, each a subprocess logged by
`run_logged`: one after the other, or (--concurrent) at once on a core each. The protocol's
paths (the peers' venvs, our recipe) and OpenNMT-tf's schedule live here too."""

import json
import os
import re
import subprocess
import sys
import time

from bench.compare import precisions
from bench.compare.report import system_of, training_keys
from bench.compare.train_logs import parse_opennmt_train, parse_ours_train

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CORPUS_DIR = os.path.join(REPO, "..", "shared", "corpora", "libreoffice-help.en-de")

ONMT_VENV = os.path.join(HERE, ".venvs", "opennmt", "bin")
ONMT_MAIN = os.path.join(ONMT_VENV, "onmt-main")
CT2_VENV = os.path.join(HERE, ".venvs", "ctranslate2", "bin")
# The start of the line opennmt_train.py exits with when its wall-clock patch no longer
# fits the installed OpenNMT-tf (opennmt_train.PATCH_ERROR; that module imports OpenNMT-tf).
OPENNMT_PATCH_ERROR = "opennmt_train.py: cannot bound OpenNMT-tf's training by minutes"
# Our side's flags: the model (3+3 layers, as opennmt_model.py), vocabulary, batch.
RECIPE = os.path.join(REPO, "tf_transformer", "recipes", "small_cpu.flags")
# OpenNMT-tf's schedule: the best on dev of its 25-minute sweep, as ours is its `small`
# preset's (bench/results/quality.md); pre-norm is opennmt_model.py's.
OPENNMT_SETTING = "onmt_w1600_pre"
OPENNMT_SCHEDULE = {"warmup_steps": 1600, "pre_norm": True}


def run_logged(command, log_path, env=None, cpus=None):
    """Runs `command` under /usr/bin/time -v; returns (timestamped lines, peak RSS MB, rc).

    Each line of stdout+stderr is kept with the seconds since the start. `cpus` (a set of
    core numbers) pins the process there; TensorFlow sizes its thread pools to it.
    """
    full = (["/usr/bin/time", "-v"] if os.path.exists("/usr/bin/time") else []) + command
    print("$ " + " ".join(command), flush=True)
    start = time.time()
    process = subprocess.Popen(full, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, errors="replace", preexec_fn=_pinned_to(cpus),
                               env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    lines = []
    with open(log_path, "w", buffering=1) as log:  # line-buffered: progress visible
        for line in process.stdout:
            elapsed = time.time() - start
            lines.append((elapsed, line.rstrip("\n")))
            log.write(f"{elapsed:9.1f} {line}")
        rc = process.wait()
    rss = re.findall(r"Maximum resident set size \(kbytes\): (\d+)", "\n".join(l for _, l in lines))
    if rc:
        print(f"  exit status {rc}; see {log_path}", flush=True)
    return lines, (int(rss[-1]) / 1024 if rss else None), rc


def _pinned_to(cpus):
    """A child's preexec_fn that pins it to `cpus` (None: no pinning)."""
    return (lambda: os.sched_setaffinity(0, cpus)) if cpus else None


def opennmt_args(d, model_file, run_yml, run, params=None, dev=None) -> list:
    """onmt-main's --model and --config of a run on the protocol's data (`d`, prepare_data's):
    `run` (model_dir, train and eval blocks) written to `run_yml` with `params`,
    OPENNMT_SCHEDULE's warmup, the training pieces, the vocabulary, and the dev pieces (`dev`:
    other (source, target) files)."""
    dev_en, dev_de = dev or (os.path.join(d["data"], f"dev.{side}.sp") for side in ("en", "de"))
    decay = {"model_dim": 256, "warmup_steps": OPENNMT_SCHEDULE["warmup_steps"]}
    data = {"train_features_file": os.path.join(d["data"], "train.en.sp"),
            "train_labels_file": os.path.join(d["data"], "train.de.sp"),
            "eval_features_file": dev_en, "eval_labels_file": dev_de,
            "source_vocabulary": d["onmt_vocab"], "target_vocabulary": d["onmt_vocab"]}
    with open(run_yml, "w") as f:
        json.dump({**run, "params": {**(params or {}), "decay_params": decay}, "data": data}, f)
    return ["--model", model_file, "--config", os.path.join(HERE, "opennmt_small_cpu.yml"), run_yml]


def train_opennmt(args, work, d, cpus=None):
    """OpenNMT-tf's run of the protocol in float32 (its mixed_float16 made no step on the
    CPU: bench/results/side_by_side.md) with OPENNMT_SCHEDULE, for args.minutes."""
    model_dir = os.path.join(work, "opennmt")
    base = opennmt_args(d, os.path.join(HERE, "opennmt_model.py"), os.path.join(work, "opennmt_run.yml"),
                        {"model_dir": model_dir, "train": {"save_summary_steps": log_every(args.minutes)}})
    log = os.path.join(work, "opennmt_train.log")
    lines, rss, _ = run_logged([os.path.join(ONMT_VENV, "python"), os.path.join(HERE, "opennmt_train.py"),
                                str(args.minutes), "--log_level", "INFO"] + base + ["train"],
                               log, cpus=cpus)
    for _, line in lines:  # stop the protocol here, not after the other training
        if line.startswith(OPENNMT_PATCH_ERROR):
            raise SystemExit(line)
    return {"base_args": base, "model_dir": model_dir, "peak_rss_mb": rss, "train_log": log,
            "setting": OPENNMT_SETTING, "schedule": OPENNMT_SCHEDULE, **parse_opennmt_train(lines),
            "counts": "source pieces (no EOS) + target pieces + EOS"}


def recipe_model(vocab_size):
    """The ModelConfig our side trains: RECIPE's preset with its model flags."""
    import dataclasses

    from tf_transformer import presets

    with open(RECIPE, encoding="utf-8") as f:
        flags = dict(line.strip()[2:].split("=", 1) for line in f if line.startswith("--"))
    model = presets.get_preset(flags["preset"], vocab_size).model
    sizes = [f.name for f in dataclasses.fields(model) if f.type in (int, "int")]
    return dataclasses.replace(model, **{k: int(v) for k, v in flags.items()
                                         if k in sizes and k != "vocab_size"})


def train_ours(args, work, d, cpus=None, dtype="float32", name="ours"):
    """Our training in `dtype` (the trainer's --dtype) into WORK/OURS_MODEL_DIRS[dtype], its
    log WORK/NAME_train.log; the dtype and schedule reported are its config.json's."""
    from tf_transformer.model_dir import ModelDir

    model_dir = os.path.join(work, precisions.OURS_MODEL_DIRS[dtype])
    log = os.path.join(work, f"{name}_train.log")
    lines, rss, _ = run_logged(
        [sys.executable, "-m", "tf_transformer.train",
         f"--flagfile={RECIPE}", f"--max_minutes={args.minutes}",
         f"--model_dir={model_dir}", f"--vocab={d['vocab']}", f"--log_every={log_every(args.minutes)}",
         f"--train_data={os.path.join(args.corpus_dir, 'train.tsv')}",
         "--dev_data=", "--keep_checkpoints=100", f"--dtype={dtype}"],
        log, cpus=cpus)
    config = ModelDir(model_dir).read_config()
    return {"model_dir": model_dir, "peak_rss_mb": rss, **parse_ours_train(lines),
            "dtype": config.train.dtype, "train_log": log,
            "schedule": {"warmup_steps": config.train.warmup_steps,
                         "learning_rate_scale": config.train.learning_rate_scale,
                         "pre_norm": config.model.pre_norm},
            "counts": "source pieces + EOS + target pieces + EOS"}


def earlier_trainings(training_json, skip) -> dict:
    """The entries of an earlier training.json for the systems skipped now (none if absent)."""
    if not os.path.exists(training_json):
        return {}
    with open(training_json) as f:
        earlier = json.load(f)
    return {k: earlier[k] for k in training_keys(earlier) if system_of(k) in skip}


def core_assignment(concurrent) -> dict:
    """{system: cores it trains on}: one core each when concurrent, else all (None)."""
    if not concurrent:
        return {"opennmt": None, "ours": None}
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("--concurrent needs two cores")
    return {"opennmt": {cores[0]}, "ours": {cores[1]}}


def matmul_peak_process(one_core: bool) -> float:
    """The float32 matmul peak in a fresh process with the binaries' process defaults (the
    kernels our trainings run on), pinned to one core when `one_core` (this process's
    TensorFlow would have sized its thread pools to every core)."""
    from tf_transformer import process_defaults

    env = dict(os.environ)
    process_defaults.apply(env)
    code = "from bench.timing import matmul_peak; print(matmul_peak('float32'))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                         check=True, preexec_fn=_pinned_to({min(os.sched_getaffinity(0))} if one_core else None))
    return float(out.stdout.split()[-1])


def train_both(args, work, d, ours=(("ours", "float32"),)) -> dict:
    """Both systems' trainings, one after the other on every core or (--concurrent) at
    once on a core each; {results key: its training results} for the systems not
    skipped. `ours` lists our trainings [(key, dtype)] (precisions.ours_trainings), run
    one after the other (with --concurrent all on our core, while OpenNMT-tf trains)."""
    import concurrent.futures

    skip, cores = args.skip.split(","), core_assignment(args.concurrent)
    jobs = {}
    if "opennmt" not in skip:
        jobs["opennmt"] = lambda: {"opennmt": train_opennmt(args, work, d, cpus=cores["opennmt"])}
    if "ours" not in skip:
        jobs["ours"] = lambda: {key: train_ours(args, work, d, cpus=cores["ours"], dtype=dtype, name=key)
                                for key, dtype in ours}
    # One worker runs the jobs in order; two run them at once.
    with concurrent.futures.ThreadPoolExecutor(2 if args.concurrent else 1) as pool:
        futures = {name: pool.submit(job) for name, job in jobs.items()}
        return {key: dict(r, **({"cores": sorted(cores[name])} if cores[name] else {}))
                for name, f in futures.items() for key, r in f.result().items()}


def log_every(minutes) -> int:
    """Steps between throughput/loss lines (the learning curves' points): 25, 10 for smoke runs."""
    return 25 if minutes >= 10 else 10
