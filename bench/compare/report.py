"""The side-by-side protocol's report: figure lines with ratios, and the learning-curve plot."""

from bench.compare import precisions

# Our decoding rows, in report order (decode_benchmark.py makes them).
OURS_DECODE_ROWS = ("ours_savedmodel_xla", "ours_savedmodel", "ours_savedmodel_1thread",
                    "ours_c_client", "ours_savedmodel_bf16", "ours_savedmodel_bf16_1thread")
# Each bfloat16 export row and the float32 row its BLEU is held to.
BF16_ROWS = {"ours_savedmodel_bf16": "ours_savedmodel",
             "ours_savedmodel_bf16_1thread": "ours_savedmodel_1thread"}
BF16_BLEU_TOLERANCE = 0.3


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [(key, "tf_transformer" + (f" ({results[key]['dtype']})" if results[key].get("dtype") else ""))
             for key in ours_keys(results)] + [("opennmt", "OpenNMT-tf 2.32")]
    keys = ["curve_train"] + [key for key in ("curve_dev", "curve_dev_bleu")
                              if any((results.get(n) or {}).get(key) for n, _ in names)]
    titles = {"curve_train": "training loss per target token (label smoothing 0.1)",
              "curve_dev": "dev loss", "curve_dev_bleu": "dev sacreBLEU (each kept checkpoint)"}
    fig, (axes,) = plt.subplots(1, len(keys), figsize=(5.5 * len(keys), 4), squeeze=False)
    for ax, key in zip(axes, keys):
        for name, label in names:
            points = (results.get(name) or {}).get(key)
            if points:
                ax.plot([t / 60 for t, _ in points], [v for _, v in points], marker=".", label=label)
        ax.set(title=titles[key], xlabel="minutes since process start")
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def system_of(key: str) -> str:
    """A results key's system: "ours" for every one of our trainings (ours, ours_float32,
    ...), else the key itself."""
    return "ours" if key == "ours" or key.startswith("ours_") else key


def training_keys(results) -> list:
    """The keys of `results` that hold a training: opennmt, ours and our other dtypes."""
    return [k for k in results if system_of(k) in ("opennmt", "ours")]


def ours_keys(results) -> list:
    """Our trainings' keys in `results`: "ours" (the primary) first, then "ours_DTYPE"."""
    return sorted((k for k in results if system_of(k) == "ours" and results[k]),
                  key=lambda k: (k != "ours", k))


def line(name, a, b, a_name, b_name="opennmt"):
    """NAME: A_NAME=a B_NAME=b ratio=a/b (without the ratio when a figure is missing)."""
    if a is None or b is None or b == 0:
        print(f"{name}: {a_name}={a} {b_name}={b}")
    else:
        print(f"{name}: {a_name}={a:.2f} {b_name}={b:.2f} ratio={a / b:.2f}")


def report_precisions(results):
    """The CPU's matrix units and each training's dtype (OpenNMT-tf's is float32)."""
    if results.get("cpu"):
        print(precisions.cpu_line(results["cpu"]))
    if any(results.get(k) for k in ["opennmt"] + ours_keys(results)):
        print("train_dtype: " + " ".join(
            f"{k}={results[k].get('dtype', 'float32')}" for k in ours_keys(results))
            + (" opennmt=float32" if results.get("opennmt") else ""))


def report_training(key, r, results, tag=""):
    """One of our trainings (results[key] is `r`) against OpenNMT-tf's: throughput in both
    counts, MFU, peak memory, dev BLEU (OpenNMT-tf's too for the primary) and test BLEU,
    each line's name followed by `tag`."""
    onmt, common = results.get("opennmt") or {}, results["common_tokens"]
    for title, name, counted in (
            ("train_tokens_per_sec (own count)", "tokens_per_sec", False),
            ("train_tokens_per_sec (common count: pieces + target EOS)", "tokens_per_sec", True),
            ("train_real_tokens_per_step (common count)", "tokens_per_step", True),
            ("train_mfu", "mfu", False), ("train_peak_rss_mb", "peak_rss_mb", False)):
        a, b = r.get(name), onmt.get(name)
        if counted:  # each system's own count rescaled to the common one
            a, b = a and a * common["ours"], b and b * common["opennmt"]
        line(title + tag, a, b, key)
    for name, trained in ((key, r), ("opennmt", onmt)) if not tag else ((key, r),):
        if trained.get("curve_dev_bleu"):
            t, best = max(trained["curve_dev_bleu"], key=lambda point: point[1])
            print(f"dev_bleu {name}: last={trained['curve_dev_bleu'][-1][1]:.2f} "
                  f"best={best:.2f} at {t / 60:.1f} min")
    print(f"test_bleu{tag}: {key}={r.get('test_bleu')} opennmt={onmt.get('test_bleu')} "
          f"difference={(r.get('test_bleu') or 0) - (onmt.get('test_bleu') or 0):.2f}")


def report_other_trainings(results):
    """The training and test-BLEU lines of our trainings besides the primary ("ours"),
    each against OpenNMT-tf, named NAME [KEY]; then the test BLEU of each dtype."""
    for key in ours_keys(results)[1:]:
        report_training(key, results[key], results, tag=f" [{key}]")
    by_dtype = {results[k].get("dtype", "float32"): results[k].get("test_bleu") for k in ours_keys(results)}
    if len(by_dtype) > 1:
        text = " ".join(f"{dtype}={bleu}" for dtype, bleu in by_dtype.items())
        bf16, f32 = by_dtype.get("mixed_bfloat16"), by_dtype.get("float32")
        if bf16 is not None and f32 is not None:
            verdict = "met" if bf16 >= f32 else "not met"
            text += (f" difference={bf16 - f32:.2f} (target: the mixed_bfloat16 run not below "
                     f"the float32 run: {verdict})")
        print("test_bleu_by_dtype: " + text)


def report_decode_precisions(dec):
    """For each of our decoding rows, the ratio to CTranslate2's fastest compute type per
    figure (naming it); the BLEU of every export; each bfloat16 export's BLEU against its
    float32 twin."""
    for ours_name in [n for n in OURS_DECODE_ROWS if dec.get(n)]:
        for key in ("sentences_per_sec", "latency_p50_ms"):
            best = precisions.fastest_peer(dec, key)
            if best:
                line(f"decode {key} vs fastest ctranslate2", dec[ours_name].get(key), best[1],
                     ours_name, best[0])
    bleus = {name: figures.get("bleu_of_this_decoder") for name, figures in dec.items() if figures}
    if bleus:
        print("decode bleu_of_every_export: " + " ".join(
            f"{name}={b:.2f}" if b is not None else f"{name}=None" for name, b in bleus.items()))
    for bf16, f32 in BF16_ROWS.items():
        a, b = bleus.get(bf16), bleus.get(f32)
        if a is not None and b is not None:
            verdict = "met" if abs(a - b) <= BF16_BLEU_TOLERANCE else "not met"
            print(f"decode bleu bfloat16 vs float32: {bf16}={a:.2f} {f32}={b:.2f} difference={a - b:.2f} "
                  f"(target: within {BF16_BLEU_TOLERANCE}: {verdict})")


def report(results):
    ours, onmt, dec = results.get("ours", {}), results.get("opennmt", {}), results["decode"]
    report_precisions(results)
    cpus = {name: r["cpu"] for name, r in (("ours", ours), ("opennmt", onmt)) if r.get("cpu")}
    if len(set(cpus.values())) > 1:
        print(f"warning: the two trainings ran on different CPUs: {cpus}")
    for name, r in (("ours", ours), ("opennmt", onmt)):
        if r.get("schedule") is not None:
            print(f"schedule {name}: {r.get('setting', 'small preset')} {r['schedule']}")
        if r.get("cores"):
            print(f"cores {name}: {r['cores']} (trained concurrently, one core each)")
    report_training("ours", ours, results)
    report_other_trainings(results)
    for peer in precisions.CTRANSLATE2_ROWS:
        p = dec.get(peer) or {}
        if p.get("backend"):
            print(f"decode {peer} backend={p['backend']} (the faster; others: "
                  f"{p.get('other_backends')})"
                  + (f" compute_type={p['effective_compute_type']}" if p.get("effective_compute_type") else ""))
    for ours_name in OURS_DECODE_ROWS if dec else ():  # --skip=decode
        ours_d = dec.get(ours_name) or {}
        if ours_name in BF16_ROWS and not ours_d:  # no bfloat16 export on this run
            continue
        if ours_d.get("xla_compiled_shapes"):
            print(f"decode {ours_name} warm-up: {ours_d['xla_compiled_shapes']} shapes compiled "
                  f"in {ours_d['xla_warmup_seconds']:.0f} s (not in the timings)")
        for peer in precisions.CTRANSLATE2_ROWS + ("opennmt_savedmodel",):
            for key in ("target_tokens_per_sec", "sentences_per_sec", "latency_p50_ms",
                        "latency_p99_ms", "process_peak_rss_mb", "bleu_of_this_decoder"):
                line(f"decode {key}", ours_d.get(key), (dec.get(peer) or {}).get(key), ours_name, peer)
    report_decode_precisions(dec)
