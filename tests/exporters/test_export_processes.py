"""The export in clean processes: the serving script without this repository or Keras,
and saved_model_cli (the stock CLI, before and after tensorflow_text registers its ops).
The XLA-compiled export served with tensorflow_text imported: test_bfloat16_export.py."""

import json
import subprocess

import pytest
from binary_fixtures import run_main
from model_fixtures import REPO_ROOT
from saved_model_fixtures import (
    DECODE_FLAGS,
    PYTHON,
    SIGNATURE_SPECS,
    clean_translate,
    dev_sentences,
    serve_bytes,
    serving_env,
)


@pytest.mark.slow
def test_clean_process_output_equals_the_translate_binary(exported, model_dir, tmp_path):
    lines = dev_sentences(40, start=100) + ["", "   "] + dev_sentences(10, start=500)
    data = ("\n".join(lines) + "\n").encode()
    got, status = clean_translate(exported, data, str(tmp_path), "--ops=libraries",
                                   "--refuse=all", "--batch_size=16")
    # Nothing of keras / keras_hub / keras_nlp / this repository was imported or importable.
    assert status["loaded_modules"] == [] and status["lines"] == len(lines)
    # Only tensorflow/__init__.py tries (keras.src.optimizers, its ImportError ignored).
    assert all("/tensorflow/__init__.py:" in r["importer"] for r in status["refused_imports"])
    assert REPO_ROOT not in status["sys_path"] and "" not in status["sys_path"]
    source = tmp_path / "input.txt"
    source.write_bytes(data)
    binary = run_main("tf_transformer.translate",  # the export's flags: the same weights
                      [f"--model_dir={model_dir}", f"--input={source}", *DECODE_FLAGS,
                       "--average_last=2"])
    assert binary["code"] == 0, binary["stderr"][-3000:]
    expected = binary["stdout"].split("\n")[:-1]
    assert len(expected) == len(lines) and got == expected
    assert len(set(got)) > 10 and got[40:42] == ["", ""]


# saved_model_cli's own main (what the `saved_model_cli` script runs), three times in one
# process: `show`, `run` before tensorflow_text is imported (the stock CLI), `run` after.
_SAVED_MODEL_CLI = """
import contextlib, io, json, sys
from absl import flags
from tensorflow.python.tools import saved_model_cli


def cli(args):
    sys.argv = ["saved_model_cli", *args]
    flags.FLAGS.unparse_flags()
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            saved_model_cli.main()
        except SystemExit as exit:
            code = 0 if exit.code is None else exit.code
        except Exception as error:  # noqa: BLE001  (the test reads it)
            code, err = 1, io.StringIO(f"{type(error).__name__}: {error}")
    return {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


show_args, run_args = json.loads(sys.argv[1])
runs = [cli(show_args), cli(run_args)]
import tensorflow_text  # noqa: E402,F401  (registers the SentencePiece ops)
runs.append(cli(run_args))
print(json.dumps(runs))
"""


@pytest.mark.slow
def test_saved_model_cli_show_and_run(exported, loaded):
    run_args = ["run", "--dir", exported, "--tag_set", "serve", "--signature_def",
                "serving_default", "--input_exprs", 'text=["Replacement table","Fonts"]']
    cli = subprocess.run([PYTHON, "-c", _SAVED_MODEL_CLI,
                          json.dumps([["show", "--dir", exported, "--all"], run_args])],
                         capture_output=True, text=True, env=serving_env(), timeout=300)
    assert cli.returncode == 0, cli.stderr[-3000:]
    show, plain, wrapped = json.loads(cli.stdout.splitlines()[-1])
    assert show["code"] == 0, show["stderr"][-2000:]
    text = show["stdout"]
    for name in SIGNATURE_SPECS:
        assert f"signature_def['{name}']" in text
    assert "inputs['text'] tensor_info:\n        dtype: DT_STRING\n        shape: (-1)" in text
    assert "'SentencepieceOp'" in text
    # The stock CLI does not import tensorflow_text, so the ops are unknown to it.
    assert plain["code"] != 0
    assert "Op type not registered 'SentencepieceOp'" in plain["stderr"]
    assert wrapped["code"] == 0, wrapped["stderr"][-2000:]
    expected = serve_bytes(loaded, ["Replacement table", "Fonts"])
    assert "Result for output key translation:" in wrapped["stdout"]
    assert repr(expected[0])[:30] in wrapped["stdout"]
