"""The protocol's decoding benchmark: each system's export decoded by decode_peer.py in its
own venv, on the same length-sorted test sentences (bench/compare/README.md)."""

import json
import os
import re
import subprocess
import sys

from bench.compare.scoring import bleu, write_pieces

# Our rows: (name, export flags, decode_peer flags). Each export is made once.
OURS = (("ours_savedmodel_xla", ("--decode_jit_compile",), {}),
        ("ours_savedmodel", (), {}),
        ("ours_savedmodel_1thread", (), {"threads": 1}))
# The same rows of the bfloat16 export (no XLA one).
OURS_BFLOAT16 = (("ours_savedmodel_bf16", ("--dtype=bfloat16",), {}),
                 ("ours_savedmodel_bf16_1thread", ("--dtype=bfloat16",), {"threads": 1}))


def ours_rows(export_dtypes) -> tuple:
    """Our decoding rows for the export dtypes (precisions.export_dtypes)."""
    return (OURS if "float32" in export_dtypes else ()) + (
        OURS_BFLOAT16 if "bfloat16" in export_dtypes else ())


def decode(python, system, model, sources, work, name, args, env=None, **extra):
    """decode_peer.py's figures for one system and setting (None if it failed)."""
    from bench.compare.trainings import HERE, run_logged

    out = os.path.join(work, f"decode_{name}.json")
    command = [python, os.path.join(HERE, "decode_peer.py"), f"--system={system}",
               f"--model={model}", f"--sources={sources}", f"--output={out}",
               f"--latency_sentences={args.latency_sentences}"]
    command += [f"--{k}={v}" for k, v in extra.items()]
    _, rss, rc = run_logged(command, os.path.join(work, f"decode_{name}.log"), env=env)
    if rc:
        return None
    with open(out, encoding="utf-8") as f:
        figures = json.load(f)
    figures["process_peak_rss_mb"] = rss
    return figures


def decode_all(args, work, d, results):
    """Every system's decoding figures into results["decode"][name]."""
    from bench.compare.trainings import CT2_VENV, ONMT_VENV, REPO, run_logged

    sp, sources, refs = d["sp"], d["test_sources"], d["test_targets"]
    order = sorted(range(len(sources)), key=lambda i: len(sp.encode(sources[i])))
    text_file = os.path.join(work, "test_sorted.txt")
    with open(text_file, "w", encoding="utf-8") as f:
        f.writelines(sources[i] + "\n" for i in order)
    pieces_file = write_pieces(os.path.join(work, "test_sorted.sp"), sp, (sources[i] for i in order))
    sorted_refs = [refs[i] for i in order]

    def finish(figures, from_pieces):
        if figures is None:
            return None
        texts = [sp.decode(t.split()) if from_pieces else t for t in figures.pop("translations")]
        timed = texts[figures.pop("timed_from", 0):]  # the C client's timing skips a batch
        tokens = sum(len(sp.encode(t)) + 1 for t in timed)  # pieces + EOS, the same count for all
        figures["target_tokens_per_sec"] = tokens / figures["batch_seconds"]
        figures["bleu_of_this_decoder"] = bleu(texts, sorted_refs)
        return figures

    skip = args.skip.split(",")
    if "ours" not in skip:
        exports = {}
        for name, export_flags, peer_flags in ours_rows(getattr(args, "export_dtypes", ["float32"])):
            if export_flags not in exports:
                exports[export_flags] = _export_ours(results, work, name, list(export_flags), REPO)
            if exports[export_flags]:
                results["decode"][name] = finish(decode(
                    sys.executable, "tf_transformer", exports[export_flags], text_file, work,
                    name, args, **peer_flags), False)
        if exports.get(()):
            results["decode"]["ours_c_client"] = finish(c_client(exports[()], text_file, work, REPO), False)
        if "ctranslate2" not in skip:
            from tf_transformer.exporters import ctranslate2 as ctranslate2_export
            from tf_transformer.model_dir import ModelDir
            ct2_dir = ctranslate2_export.run_export(ModelDir(results["ours"]["model_dir"]),
                                                    os.path.join(work, "ct2_ours"))
            for compute_type in ("float32", "int8"):
                results["decode"][f"ctranslate2_{compute_type}"] = ctranslate2_best(
                    lambda backend, env: finish(decode(
                        os.path.join(CT2_VENV, "python"), "ctranslate2", ct2_dir, pieces_file,
                        work, f"ct2_{compute_type}_{backend}", args, env=env,
                        compute_type=compute_type), True))
    if "opennmt" not in skip:
        export_dir = os.path.join(work, "export_opennmt")
        run_logged([os.path.join(ONMT_VENV, "onmt-main")] + results["opennmt"]["base_args"]
                   + ["export", "--output_dir", export_dir, "--export_format", "saved_model"],
                   os.path.join(work, "opennmt_export.log"))
        results["decode"]["opennmt_savedmodel"] = finish(decode(
            os.path.join(ONMT_VENV, "python"), "opennmt", export_dir, pieces_file, work,
            "opennmt", args), True)


def c_client(export, text_file, work, repo):
    """The default export decoded by export/serving/c_client, one intra-op thread, batches
    of 32 (c_client_figures); None if it cannot be built or fails."""
    client_dir = os.path.join(repo, "export", "serving", "c_client")
    make = ["make", "-s", "-C", client_dir, f"PY={sys.executable}"]
    built = subprocess.run(make, capture_output=True, text=True)
    library = subprocess.run(make + ["ops-library"], capture_output=True, text=True).stdout.strip()
    if built.returncode or not os.path.exists(library):
        print("c_client build failed:\n" + built.stdout[-1000:] + built.stderr[-1000:])
        return None
    command = [os.path.join(client_dir, "translate"), f"--saved_model={export}",
               f"--ops_library={library}", "--batch_size=32", "--intra_op_threads=1"]
    if os.path.exists("/usr/bin/time"):
        command = ["/usr/bin/time", "-f", "peak_rss_kb=%M"] + command
    print("$ " + " ".join(command), flush=True)
    with open(text_file, "rb") as f:
        run = subprocess.run(command, stdin=f, capture_output=True, env={"PATH": os.environ["PATH"]})
    log = run.stderr.decode("utf-8", "replace")
    with open(os.path.join(work, "decode_ours_c_client.log"), "w", encoding="utf-8") as f:
        f.write(log)
    figures = c_client_figures(log, run.stdout.decode("utf-8"))
    if run.returncode or figures is None:
        print(f"c_client failed ({run.returncode}): {log[-1000:]}")
        return None
    return figures


def c_client_figures(stderr: str, stdout: str):
    """The C client's timing line (and /usr/bin/time's peak_rss_kb=) -> decode figures,
    timed without the first batch when there is more than one; None without the line."""
    lines = [line for line in stderr.splitlines() if line.startswith(("c_client ", "peak_rss_kb="))]
    timing = dict(re.findall(r"(\w+)=([0-9.]+)", "\n".join(lines)))
    if "sentences" not in timing:
        return None
    sentences, batch = int(timing["sentences"]), int(timing["batch_size"])
    seconds, first = float(timing["seconds"]), float(timing["first_batch_seconds"])
    timed_from = batch if sentences > batch else 0  # one batch only: nothing to leave out
    steady = seconds - first if timed_from else seconds
    return {"system": "tf_transformer_c_client", "sentences": sentences, "batch_size": batch,
            "batch_seconds": steady, "sentences_per_sec": (sentences - timed_from) / steady,
            "timed_from": timed_from,
            "whole_run_sentences_per_sec": sentences / seconds, "first_batch_seconds": first,
            "load_seconds": float(timing["load_seconds"]),
            "process_peak_rss_mb": float(timing.get("peak_rss_kb", "nan")) / 1024,
            "translations": stdout.split("\n")[:sentences]}


def _export_ours(results, work, name, flags, repo):
    """`python -m export` of our checkpoint into WORK/export_NAME: the version's path, or None."""
    export_dir = os.path.join(work, "export_" + name)
    out = subprocess.run([sys.executable, "-m", "export", f"--model_dir={results['ours']['model_dir']}",
                          f"--export_dir={export_dir}"] + flags, cwd=repo, capture_output=True, text=True)
    if out.returncode:
        print(f"{name} export failed:\n" + out.stderr[-2000:])
        return None
    return out.stdout.strip().splitlines()[-1]


def ctranslate2_best(decode_with):
    """CTranslate2's figures with its faster GEMM backend here (`backend`; the other's
    figures too): MKL and oneDNN (CT2_USE_MKL) differ by 2-7x by CPU."""
    runs = {}
    for backend, use_mkl in (("mkl", "1"), ("onednn", "0")):
        figures = decode_with(backend, {"CT2_USE_MKL": use_mkl})
        if figures:
            runs[backend] = figures
    if not runs:
        return None
    best = max(runs, key=lambda b: runs[b]["sentences_per_sec"])
    other = {b: {k: runs[b][k] for k in ("sentences_per_sec", "latency_p50_ms")}
             for b in runs if b != best}
    return {**runs[best], "backend": best, "other_backends": other}
