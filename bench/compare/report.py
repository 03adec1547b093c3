"""The side-by-side protocol's report: figure lines with ratios, and the learning-curve plot."""

import statistics


def steady(values):
    """Median of the logged throughput windows after the first (tracing, warm-up)."""
    values = list(values)
    values = values[1:] if len(values) > 1 else values
    return statistics.median(values) if values else None


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = (("ours", "tf_transformer"), ("opennmt", "OpenNMT-tf 2.32"))
    keys = ["curve_train"] + [key for key in ("curve_dev", "curve_dev_bleu")
                              if any((results.get(n) or {}).get(key) for n, _ in names)]
    titles = {"curve_train": "training loss per target token (label smoothing 0.1)",
              "curve_dev": "dev loss", "curve_dev_bleu": "dev sacreBLEU (each kept checkpoint)"}
    fig, axes = plt.subplots(1, len(keys), figsize=(5.5 * len(keys), 4), squeeze=False)
    axes = axes[0]
    for name, label in names:
        r = results.get(name) or {}
        for ax, key in zip(axes, keys):
            points = r.get(key) or []
            if points:
                ax.plot([t / 60 for t, _ in points], [v for _, v in points], marker=".", label=label)
    for ax, key in zip(axes, keys):
        ax.set_title(titles[key])
        ax.set_xlabel("minutes since process start")
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def report(results):
    ours, onmt, dec = results.get("ours", {}), results.get("opennmt", {}), results["decode"]

    def line(name, a, b, unit="", a_name="ours", b_name="opennmt"):
        if a is None or b is None or b == 0:
            print(f"{name}: {a_name}={a} {b_name}={b}")
            return
        print(f"{name}: {a_name}={a:.2f}{unit} {b_name}={b:.2f}{unit} ratio={a / b:.2f}")

    cpus = {name: r["cpu"] for name, r in (("ours", ours), ("opennmt", onmt)) if r.get("cpu")}
    if len(set(cpus.values())) > 1:
        print(f"warning: the two trainings ran on different CPUs: {cpus}")
    for name, r in (("ours", ours), ("opennmt", onmt)):
        if r.get("schedule") is not None:
            print(f"schedule {name}: {r.get('setting', 'small preset')} {r['schedule']}")
        if r.get("cores"):
            print(f"cores {name}: {r['cores']} (trained concurrently, one core each)")
    common = results["common_tokens"]
    line("train_tokens_per_sec (own count)", ours.get("tokens_per_sec"), onmt.get("tokens_per_sec"))
    line("train_tokens_per_sec (common count: pieces + target EOS)",
         ours.get("tokens_per_sec") and ours["tokens_per_sec"] * common["ours"],
         onmt.get("tokens_per_sec") and onmt["tokens_per_sec"] * common["opennmt"])
    line("train_real_tokens_per_step (common count)",
         ours.get("tokens_per_step") and ours["tokens_per_step"] * common["ours"],
         onmt.get("tokens_per_step") and onmt["tokens_per_step"] * common["opennmt"])
    line("train_mfu", ours.get("mfu"), onmt.get("mfu"))
    line("train_peak_rss_mb", ours.get("peak_rss_mb"), onmt.get("peak_rss_mb"))
    for name, r in (("ours", ours), ("opennmt", onmt)):
        if r.get("curve_dev_bleu"):
            t, best = max(r["curve_dev_bleu"], key=lambda point: point[1])
            print(f"dev_bleu {name}: last={r['curve_dev_bleu'][-1][1]:.2f} "
                  f"best={best:.2f} at {t / 60:.1f} min")
    print(f"test_bleu: ours={ours.get('test_bleu')} opennmt={onmt.get('test_bleu')} "
          f"difference={(ours.get('test_bleu') or 0) - (onmt.get('test_bleu') or 0):.2f}")
    for peer in ("ctranslate2_float32", "ctranslate2_int8"):
        p = dec.get(peer) or {}
        if p.get("backend"):
            print(f"decode {peer} backend={p['backend']} (the faster; others: "
                  f"{p.get('other_backends')})")
    for ours_name in ("ours_savedmodel_xla", "ours_savedmodel", "ours_savedmodel_1thread",
                      "ours_c_client") if dec else ():  # --skip=decode
        ours_d = dec.get(ours_name) or {}
        if ours_d.get("xla_compiled_shapes"):
            print(f"decode {ours_name} warm-up: {ours_d['xla_compiled_shapes']} shapes compiled "
                  f"in {ours_d['xla_warmup_seconds']:.0f} s (not in the timings)")
        for peer in ("ctranslate2_float32", "ctranslate2_int8", "opennmt_savedmodel"):
            p = dec.get(peer) or {}
            for key in ("target_tokens_per_sec", "sentences_per_sec", "latency_p50_ms",
                        "latency_p99_ms", "process_peak_rss_mb", "bleu_of_this_decoder"):
                line(f"decode {key}", ours_d.get(key), p.get(key), a_name=ours_name,
                     b_name=peer)
