"""Which precision training computes in, and whether this machine pays for it.

`--dtype=auto` (the CPU recipes' choice) resolves here, before the config is
written to the model directory: mixed_bfloat16 on a GPU, or on a CPU with
bfloat16 matrix units (Intel AMX's `amx_bf16`: oneDNN runs bfloat16 products
on its tiles, several times faster than float32); float32 elsewhere, where
bfloat16 runs no faster (AVX-512 BF16 only converts and dots pairs) or much
slower (no bfloat16 instructions at all). The trainer's log names the CPU's
matrix units and warns about a precision that will not pay:

  mixed_bfloat16 on a CPU without amx_bf16     no faster than float32
  mixed_float16 on a CPU                        every product emulated (~100x slower)

The CPU's units come from /proc/cpuinfo's flags (Linux); elsewhere none are known.
"""

from __future__ import annotations

import dataclasses

from tf_transformer.config import Config

# /proc/cpuinfo flags of the CPU's reduced-precision matrix units, by what they do.
MATRIX_UNIT_FLAGS = ("amx_bf16", "amx_fp16", "amx_int8", "avx512_bf16", "avx512_fp16",
                     "avx512_vnni")
CPUINFO = "/proc/cpuinfo"


def cpu_matrix_units(cpuinfo: str = CPUINFO) -> tuple[str, ...]:
    """The MATRIX_UNIT_FLAGS the CPU reports, sorted; () where /proc/cpuinfo is unreadable."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return ()
    flags = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags.update(line.partition(":")[2].split())
    return tuple(sorted(flags & set(MATRIX_UNIT_FLAGS)))


def resolve_dtype(requested: str, units: tuple[str, ...], gpus: int) -> str:
    """The training dtype for `requested` ("auto" or a concrete one) on this machine."""
    if requested != "auto":
        return requested
    if gpus or "amx_bf16" in units:
        return "mixed_bfloat16"
    return "float32"


def warnings(dtype: str, units: tuple[str, ...], gpus: int) -> list[str]:
    """Why `dtype` will not pay on this machine (empty if it will, or on a GPU)."""
    if gpus:
        return []
    if dtype == "mixed_float16":
        return ["mixed_float16 on a CPU: no float16 matrix units, every product is emulated "
                "(about 100x slower than float32); use float32, or mixed_bfloat16 with amx_bf16"]
    if dtype == "mixed_bfloat16" and "amx_bf16" not in units:
        which = "only avx512_bf16" if "avx512_bf16" in units else "no bfloat16 instructions"
        return [f"mixed_bfloat16 on a CPU without bfloat16 matrix units ({which}): "
                "no faster than float32 here; --dtype=auto picks float32"]
    return []


def resolve(config: Config, units: tuple[str, ...], gpus: int) -> Config:
    """`config` with TrainConfig.dtype resolved (resolve_dtype)."""
    dtype = resolve_dtype(config.train.dtype, units, gpus)
    return config.replace(train=dataclasses.replace(config.train, dtype=dtype))
