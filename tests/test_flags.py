"""Flags to config (tf_transformer/flags.py) and the one d_k/d_v rule (config.py).

flags.py defines its groups on the global absl registry, where the export test
has already defined some of the same names (binaries run one per process), so
the flag-parsing checks run in a subprocess; it imports no TensorFlow.
"""

import json
import subprocess
import sys

from model_fixtures import REPO_ROOT

from tf_transformer import presets

_SCRIPT = """
import json, sys
from absl import flags
from tf_transformer import flags as f
f.define_model_flags()
f.define_decode_flags(nbest_help=None, batch_size=True, dtype=False)
out = []
for argv in json.loads(sys.argv[1]):
    flags.FLAGS.unparse_flags()
    flags.FLAGS(["x", *argv])
    c = f.config_from_flags(vocab_size=1000)
    m = c.model
    out.append({"d_k": m.d_k, "d_v": m.d_v, "key_dim": m.key_dim, "value_dim": m.value_dim,
                "d_model": m.d_model, "decode": f.decode_overrides(), "dtype": c.train.dtype,
                "relu_dropout": m.relu_dropout})
print(json.dumps(out))
"""


def _parse(*argvs):
    result = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(argvs)], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


def test_new_width_or_heads_reset_a_presets_explicit_head_sizes():
    model = presets.get_preset("c_dmodel256").model  # d_model 256, h 8, d_k = d_v = 32
    assert (model.d_k, model.key_dim) == (32, 32)
    wider = model.with_overrides({"num_heads": 4})
    assert (wider.d_k, wider.d_v, wider.key_dim, wider.value_dim) == (0, 0, 64, 64)
    assert model.with_overrides({"d_model": 512}).key_dim == 64
    assert model.with_overrides({"num_heads": 4, "d_k": 16}).key_dim == 16  # set: kept
    assert model.with_overrides({"num_heads": 4, "d_k": 16}).value_dim == 64
    assert model.with_overrides({"dropout": 0.2}).d_k == 32  # unrelated change: kept
    assert presets.get_preset("b_dk16").model.with_overrides({"d_ff": 1024}).d_k == 16


def test_model_and_decode_flags_become_config_overrides():
    plain, heads, explicit, row_b, decode = _parse(
        [], ["--preset=c_dmodel256", "--num_heads=4"],
        ["--preset=c_dmodel256", "--num_heads=4", "--d_k=16"],
        ["--preset=b_dk16", "--dropout=0.2"],
        ["--beam_size=2", "--alpha=1.0", "--nodecode_jit_compile", "--batch_size=7"])
    assert plain["decode"] == {} and plain["d_model"] == 128  # the tiny preset, nothing set
    assert (heads["d_k"], heads["key_dim"], heads["value_dim"]) == (0, 64, 64)
    assert (explicit["key_dim"], explicit["value_dim"]) == (16, 64)
    assert (row_b["d_k"], row_b["key_dim"]) == (16, 16)
    assert decode["decode"] == {"beam_size": 2, "alpha": 1.0, "jit_compile": False,
                                "batch_size": 7}


def test_training_dtype_is_auto_unless_set_and_relu_dropout_is_a_model_flag():
    """`make demo` trains in bfloat16 on an AMX CPU without a flag: --dtype defaults to auto
    (resolved by training/precision.py), whatever the preset."""
    plain, explicit, big = _parse([], ["--dtype=float32", "--relu_dropout=0.3"],
                                  ["--preset=big"])
    assert (plain["dtype"], plain["relu_dropout"]) == ("auto", 0.0)
    assert (explicit["dtype"], explicit["relu_dropout"]) == ("float32", 0.3)
    assert big["dtype"] == "auto"
