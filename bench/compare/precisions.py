"""Which precision our side of the protocol runs in, from what this CPU offers: pure
functions of /proc/cpuinfo's text and the flags; CTranslate2's fastest compute type."""

# /proc/cpuinfo flags of the units that run reduced-precision products: AMX tiles
# (bfloat16, float16, int8) and the AVX-512 dot-product instructions (bfloat16,
# float16, int8 VNNI). Reported in this order when present.
MATRIX_UNITS = ("amx_bf16", "amx_fp16", "amx_int8", "avx512_bf16", "avx512_fp16", "avx512_vnni")

# Our trainer's --dtype values the protocol trains with, and each one's model
# directory under WORK_DIR (float32 keeps the directory it always had).
OURS_DTYPES = ("float32", "mixed_bfloat16")
OURS_MODEL_DIRS = {"float32": "ours", "mixed_bfloat16": "ours_bf16"}
# Our export's --dtype values (python -m export --dtype).
EXPORT_DTYPES = ("float32", "bfloat16")
CTRANSLATE2_ROWS = ("ctranslate2_float32", "ctranslate2_int8")


def parse_cpuinfo(text: str) -> dict:
    """/proc/cpuinfo's text -> {"model": the first model name, "matrix_units": the
    MATRIX_UNITS among the first processor's flags}."""
    model, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return {"model": model, "matrix_units": [u for u in MATRIX_UNITS if u in flags]}


def read_cpuinfo(path: str = "/proc/cpuinfo") -> dict:
    """parse_cpuinfo of this machine (empty figures where the file is missing)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return parse_cpuinfo(f.read())
    except OSError:
        return parse_cpuinfo("")


def cpu_line(cpu: dict) -> str:
    """The report's line: cpu model="..." matrix_units=a,b (or none)."""
    return f'cpu model="{cpu.get("model", "")}" matrix_units={",".join(cpu.get("matrix_units") or []) or "none"}'


def has_bfloat16_tiles(cpu: dict) -> bool:
    """AMX bfloat16: the units our bfloat16 training and exports are fast on."""
    return "amx_bf16" in (cpu.get("matrix_units") or [])


def ours_dtype(choice: str, cpu: dict) -> str:
    """--ours_dtype (auto, float32, mixed_bfloat16) -> our trainer's --dtype."""
    if choice == "auto":
        return "mixed_bfloat16" if has_bfloat16_tiles(cpu) else "float32"
    if choice not in OURS_DTYPES:
        raise ValueError(f"our training dtype must be auto or one of {OURS_DTYPES}, got {choice!r}")
    return choice


def ours_trainings(primary: str, others: str, cpu: dict) -> list:
    """[(results key, dtype)] of our trainings, in training order: --ours_dtypes (a comma
    list, `auto` allowed; empty: only the primary) with --ours_dtype's (the primary)
    added first if missing. The primary's key is "ours" (the report's existing lines),
    every other's "ours_" + its dtype."""
    main = ours_dtype(primary, cpu)
    dtypes = list(dict.fromkeys(ours_dtype(c.strip(), cpu) for c in others.split(",") if c.strip()))
    if main not in dtypes:
        dtypes.insert(0, main)
    return [("ours" if dtype == main else "ours_" + dtype, dtype) for dtype in dtypes]


def export_dtypes(choice: str, cpu: dict) -> list:
    """--ours_export_dtypes (a comma list of EXPORT_DTYPES, or auto: float32, plus
    bfloat16 on a CPU with AMX bfloat16) -> the dtypes our checkpoint is exported in."""
    if choice == "auto":
        return ["float32", "bfloat16"] if has_bfloat16_tiles(cpu) else ["float32"]
    dtypes = [c.strip() for c in choice.split(",") if c.strip()]
    if not dtypes or set(dtypes) - set(EXPORT_DTYPES):
        raise ValueError(f"export dtypes must be auto or a list of {EXPORT_DTYPES}, got {choice!r}")
    return dtypes


def fastest_peer(decode: dict, key: str, peers=CTRANSLATE2_ROWS):
    """(peer row, its value) of the fastest of `peers` in decode[...][key]: the most
    per second, or the least milliseconds for a latency (keys ending in _ms); None when
    no peer has the figure."""
    values = {p: v for p in peers if (v := (decode.get(p) or {}).get(key)) is not None}
    if not values:
        return None
    best = (min if key.endswith("_ms") else max)(values, key=values.get)
    return best, values[best]
