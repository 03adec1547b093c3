"""training/precision.py: the CPU's matrix units from /proc/cpuinfo, --dtype=auto, and the
warnings for a precision that will not pay."""

import pytest

from tf_transformer.config import Config, ConfigError, TrainConfig
from tf_transformer.training import precision

SAPPHIRE_RAPIDS = ("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_vnni avx512_bf16 "
                   "avx512_fp16 amx_bf16 amx_tile amx_int8\n\nprocessor\t: 1\nflags\t\t: fpu "
                   "avx512f avx512_vnni avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8\n")
COOPER_LAKE = "flags\t: fpu avx2 avx512f avx512_vnni avx512_bf16\n"
ZEN3 = "flags\t: fpu avx2 fma\n"


@pytest.mark.parametrize("text,units", [
    (SAPPHIRE_RAPIDS, ("amx_bf16", "amx_int8", "avx512_bf16", "avx512_fp16", "avx512_vnni")),
    (COOPER_LAKE, ("avx512_bf16", "avx512_vnni")),
    (ZEN3, ())])
def test_matrix_units_are_read_from_cpuinfo_flags(tmp_path, text, units):
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    assert precision.cpu_matrix_units(str(path)) == units


def test_no_cpuinfo_means_no_units_known(tmp_path):
    assert precision.cpu_matrix_units(str(tmp_path / "missing")) == ()


@pytest.mark.parametrize("units,gpus,want", [
    (("amx_bf16", "avx512_bf16"), 0, "mixed_bfloat16"),
    (("avx512_bf16",), 0, "float32"),
    ((), 0, "float32"),
    ((), 1, "mixed_bfloat16")])
def test_auto_picks_bfloat16_only_where_it_pays(units, gpus, want):
    assert precision.resolve_dtype("auto", units, gpus) == want
    assert precision.resolve_dtype("float32", units, gpus) == "float32"  # an explicit choice
    config = Config(train=TrainConfig(dtype="auto"))
    assert precision.resolve(config, units, gpus).train.dtype == want


def test_warnings_name_the_precisions_that_will_not_pay():
    assert "100x" in precision.warnings("mixed_float16", ("amx_bf16",), 0)[0]
    assert "only avx512_bf16" in precision.warnings("mixed_bfloat16", ("avx512_bf16",), 0)[0]
    assert "no bfloat16 instructions" in precision.warnings("mixed_bfloat16", (), 0)[0]
    assert precision.warnings("mixed_bfloat16", ("amx_bf16",), 0) == []
    assert precision.warnings("float32", (), 0) == []
    assert precision.warnings("mixed_float16", (), 1) == []  # a GPU has float16 units


def test_unknown_dtypes_are_refused():
    with pytest.raises(ConfigError):
        TrainConfig(dtype="bfloat16")
