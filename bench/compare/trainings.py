"""The protocol's two trainings, OpenNMT-tf's and ours, each a logged subprocess: one after
the other, or (--concurrent) at once on a core each. Every output line is timestamped
(`run_logged`: the learning curves) and every process runs under /usr/bin/time -v (its
peak RSS). The protocol's paths (the peers' venvs, our recipe) live here too.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

from bench.compare import precisions
from bench.compare.report import probe_line, system_of, training_keys
from bench.compare.train_logs import parse_opennmt_train, parse_ours_train

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

ONMT_VENV = os.path.join(HERE, ".venvs", "opennmt", "bin")
CT2_VENV = os.path.join(HERE, ".venvs", "ctranslate2", "bin")
# The start of the line opennmt_train.py exits with when its wall-clock patch no longer
# fits the installed OpenNMT-tf (opennmt_train.PATCH_ERROR; that module imports OpenNMT-tf).
OPENNMT_PATCH_ERROR = "opennmt_train.py: cannot bound OpenNMT-tf's training by minutes"
# Our side's flags: the model (3+3 layers, as opennmt_model.py), vocabulary, batch.
RECIPE = os.path.join(REPO, "tf_transformer", "recipes", "small_cpu.flags")
# Steps between the throughput lines of OpenNMT-tf's precision probes (a few minutes).
PROBE_LOG_EVERY = 5
# A probe still running this long after its budget is stopped and counted as the slower:
# its budget includes the set-up and first step, and the final checkpoint takes seconds.
# (On the AMX Xeon, mixed_float16 had not finished its first step after five minutes:
# bench/compare/README.md, "Precisions".)
PROBE_GRACE_SECONDS = 120
# run_logged's line when it stops a process at its timeout.
TIMEOUT_LINE = "run_logged: stopped at its timeout of"


def run_logged(command, log_path, cwd=REPO, env=None, cpus=None, timeout=None):
    """Runs `command` under /usr/bin/time -v; returns (timestamped lines, peak RSS MB, rc).

    Each line of stdout+stderr is kept with the seconds since the start. `cpus` (a set of
    core numbers) pins the process there; TensorFlow sizes its thread pools to it.
    `timeout` (seconds): the process, in a session of its own, and its children are
    sent SIGTERM then, and a line starting TIMEOUT_LINE is added.
    """
    time_bin = "/usr/bin/time"
    full = ([time_bin, "-v"] if os.path.exists(time_bin) else []) + command
    print("$ " + " ".join(command), flush=True)
    start = time.time()
    process = subprocess.Popen(full, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, errors="replace", env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                               preexec_fn=_pinned_to(cpus), start_new_session=timeout is not None)
    timer = threading.Timer(timeout, _stop_group, [process]) if timeout is not None else None
    if timer:
        timer.start()
    lines = []
    with open(log_path, "w", buffering=1) as log:  # line-buffered: progress visible
        for line in process.stdout:
            elapsed = time.time() - start
            lines.append((elapsed, line.rstrip("\n")))
            log.write(f"{elapsed:9.1f} {line}")
        rc = process.wait()
        if timer:
            timer.cancel()
            if rc and getattr(process, "stopped_by_timeout", False):
                note = f"{TIMEOUT_LINE} {timeout:.0f} s"
                lines.append((time.time() - start, note))
                log.write(f"{lines[-1][0]:9.1f} {note}\n")
                print("  " + note, flush=True)
    rss = [int(m.group(1)) for _, l in lines
           for m in [re.search(r"Maximum resident set size \(kbytes\): (\d+)", l)] if m]
    if rc:
        print(f"  exit status {rc}; see {log_path}", flush=True)
    return lines, (rss[-1] / 1024 if rss else None), rc


def _stop_group(process):
    """SIGTERM to a process started in a session of its own and to its children."""
    process.stopped_by_timeout = True
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:  # it ended meanwhile
        pass


def _pinned_to(cpus):
    """A child's preexec_fn that pins it to `cpus` (None: no pinning)."""
    return (lambda: os.sched_setaffinity(0, cpus)) if cpus else None


def train_opennmt(args, work, d, name="opennmt", schedule=None, cpus=None, precision="float32",
                  minutes=None, log_every=None, timeout=None):
    """OpenNMT-tf's run of the protocol; `schedule` (settings.opennmt_schedule) changes its
    learning-rate schedule and norm position, as the dev-split sweep does. `precision`
    "mixed" trains with `--mixed_precision` (mixed_float16), which OpenNMT-tf enables only
    on an NVIDIA GPU: opennmt_train.py forces it on the CPU (OPENNMT_FORCE_MIXED_PRECISION).
    `minutes` (default args.minutes) is the budget, `log_every` (default _log_every) the
    steps between throughput lines, `timeout` (seconds) stops the process (run_logged)."""
    schedule = schedule or {}
    minutes = args.minutes if minutes is None else minutes
    log_every = log_every or _log_every(minutes)
    model_dir = os.path.join(work, name)
    run_yml = os.path.join(work, f"{name}_run.yml")
    params = {}
    if "learning_rate_scale" in schedule:
        params["learning_rate"] = schedule["learning_rate_scale"]
    if "warmup_steps" in schedule:
        params["decay_params"] = {"model_dim": 256, "warmup_steps": schedule["warmup_steps"]}
    with open(run_yml, "w") as f:
        json.dump({"model_dir": model_dir, "train": {"save_summary_steps": log_every},
                   **({"params": params} if params else {}),
                   "data": {
            "train_features_file": os.path.join(d["data"], "train.en.sp"),
            "train_labels_file": os.path.join(d["data"], "train.de.sp"),
            "eval_features_file": os.path.join(d["data"], "dev.en.sp"),
            "eval_labels_file": os.path.join(d["data"], "dev.de.sp"),
            "source_vocabulary": d["onmt_vocab"], "target_vocabulary": d["onmt_vocab"]}}, f)
    base = ["--model", os.path.join(HERE, "opennmt_model.py"),
            "--config", os.path.join(HERE, "opennmt_small_cpu.yml"), run_yml]
    env = {"OPENNMT_PRE_NORM": "1" if schedule.get("pre_norm") else "0"}
    mixed = precision == "mixed"
    # Training only: inference and export (base_args, env) stay float32.
    lines, rss, _ = run_logged([os.path.join(ONMT_VENV, "python"), os.path.join(HERE, "opennmt_train.py"),
                                str(minutes), "--log_level", "INFO"] + base
                               + (["--mixed_precision"] if mixed else []) + ["train"],
                               os.path.join(work, f"{name}_train.log"),
                               env={**env, **({"OPENNMT_FORCE_MIXED_PRECISION": "1"} if mixed else {})},
                               cpus=cpus, timeout=timeout)
    for _, line in lines:  # stop the protocol here, not after the other training
        if line.startswith(OPENNMT_PATCH_ERROR):
            raise SystemExit(line)
    return {"base_args": base, "env": env, "model_dir": model_dir, "peak_rss_mb": rss,
            "schedule": schedule, "train_log": os.path.join(work, f"{name}_train.log"),
            "precision": precision, "mixed_float16": mixed and mixed_precision_enabled(lines),
            "stopped_by_timeout": any(line.startswith(TIMEOUT_LINE) for _, line in lines),
            **parse_opennmt_train(lines), "counts": "source pieces (no EOS) + target pieces + EOS"}


def mixed_precision_enabled(lines) -> bool:
    """Whether an OpenNMT-tf training log shows mixed_float16 on: opennmt_train.py's
    `mixed_precision=forced` line and no "Mixed precision not enabled" warning."""
    text = "\n".join(line for _, line in lines)
    return "mixed_precision=forced" in text and "Mixed precision not enabled" not in text


def probe_opennmt(args, work, d, schedule=None, cpus=None) -> dict:
    """{precision: its probe's figures}: OpenNMT-tf trained --opennmt_probe_minutes in each
    of OPENNMT_PRECISIONS from scratch (each probe's model directory is removed before
    and after; its log stays, opennmt_probe_PRECISION_train.log). Throughput lines every
    PROBE_LOG_EVERY steps: the budget includes the set-up and the first step's tracing
    (some 25 s), whose window the median leaves out."""
    probes = {}
    for precision in precisions.OPENNMT_PRECISIONS:
        name = f"opennmt_probe_{precision}"
        shutil.rmtree(os.path.join(work, name), ignore_errors=True)  # no resuming
        r = train_opennmt(args, work, d, name=name, schedule=schedule, cpus=cpus,
                          precision=precision, minutes=args.opennmt_probe_minutes,
                          log_every=PROBE_LOG_EVERY,
                          timeout=60 * args.opennmt_probe_minutes + PROBE_GRACE_SECONDS)
        shutil.rmtree(r["model_dir"], ignore_errors=True)
        probes[precision] = {k: r[k] for k in ("tokens_per_sec", "last_step", "peak_rss_mb",
                                               "mixed_float16", "stopped_by_timeout", "train_log")}
        probes[precision]["minutes"] = args.opennmt_probe_minutes
        print(probe_line(precision, probes[precision]), flush=True)
    return probes


def train_opennmt_fastest(args, work, d, schedule=None, cpus=None, probe=None) -> dict:
    """OpenNMT-tf's timed training in its faster precision (precisions.opennmt_precision:
    --opennmt_precision, else the faster of `probe`); the probe's figures are kept."""
    probe = probe or {}
    precision, chosen_by = precisions.opennmt_precision(
        getattr(args, "opennmt_precision", "float32"),
        {p: r.get("tokens_per_sec") for p, r in probe.items()})
    r = train_opennmt(args, work, d, schedule=schedule, cpus=cpus, precision=precision)
    return dict(r, precision_chosen_by=chosen_by, **({"precision_probe": probe} if probe else {}))


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
    log WORK/NAME_train.log; the dtype reported is config.json's (--ours_flags may set it)."""
    model_dir = os.path.join(work, precisions.OURS_MODEL_DIRS[dtype])
    lines, rss, _ = run_logged(
        [sys.executable, "-m", "tf_transformer.train",
         f"--flagfile={RECIPE}", f"--max_minutes={args.minutes}",
         f"--model_dir={model_dir}", f"--vocab={d['vocab']}", f"--log_every={_log_every(args.minutes)}",
         f"--train_data={os.path.join(args.corpus_dir, 'train.tsv')}",
         "--dev_data=", "--keep_checkpoints=100", f"--dtype={dtype}"] + args.ours_flags.split(),
        os.path.join(work, f"{name}_train.log"), cpus=cpus)
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    return {"model_dir": model_dir, "peak_rss_mb": rss, **parse_ours_train(lines),
            "dtype": config["train"]["dtype"],
            "schedule": {"warmup_steps": config["train"]["warmup_steps"],
                         "learning_rate_scale": config["train"]["learning_rate_scale"],
                         "pre_norm": config["model"]["pre_norm"]},
            "train_log": os.path.join(work, f"{name}_train.log"),
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


def train_both(args, work, d, schedule, ours=(("ours", "float32"),)) -> dict:
    """Both systems' trainings, one after the other on every core or (--concurrent) at
    once on a core each; {results key: its training results} for the systems not
    skipped. OpenNMT-tf's precision probe (--opennmt_probe_minutes, with
    --opennmt_precision=auto) runs first, alone, on OpenNMT-tf's cores; `ours` lists
    our trainings [(key, dtype)] (precisions.ours_trainings), run one after the other
    (with --concurrent all on our core, while OpenNMT-tf trains on the other)."""
    import concurrent.futures

    skip, cores = args.skip.split(","), core_assignment(args.concurrent)
    probe = {}
    if ("opennmt" not in skip and getattr(args, "opennmt_precision", "float32") == "auto"
            and getattr(args, "opennmt_probe_minutes", 0) > 0):
        probe = probe_opennmt(args, work, d, schedule=schedule, cpus=cores["opennmt"])
    jobs = {}
    if "opennmt" not in skip:
        jobs["opennmt"] = lambda: {"opennmt": train_opennmt_fastest(
            args, work, d, schedule=schedule, cpus=cores["opennmt"], probe=probe)}
    if "ours" not in skip:
        jobs["ours"] = lambda: {key: train_ours(args, work, d, cpus=cores["ours"], dtype=dtype, name=key)
                                for key, dtype in ours}
    # One worker runs the jobs in order; two run them at once.
    with concurrent.futures.ThreadPoolExecutor(2 if args.concurrent else 1) as pool:
        futures = {name: pool.submit(job) for name, job in jobs.items()}
        return {key: dict(r, **({"cores": sorted(cores[name])} if cores[name] else {}))
                for name, f in futures.items() for key, r in f.result().items()}


def _log_every(minutes) -> int:
    """Steps between throughput/loss lines (the learning curves' points): 25, 10 for smoke
    runs and probes."""
    return 25 if minutes >= 10 else 10
