"""The export in clean processes: the serving script without this repository or Keras,
with tensorflow_text imported, the XLA-compiled export, and saved_model_cli (the stock
CLI, before and after tensorflow_text registers its ops)."""

import json
import os
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
    export_model,
    serve_bytes,
    serving_env,
)

from tf_transformer.exporters import saved_model


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


@pytest.fixture(scope="module")
def compiled_run(model_dir, tmp_path_factory):
    """The --decode_jit_compile export (the XLA search inside the SavedModel) served by a
    clean process that imports tensorflow_text, refusing keras_hub, keras_nlp and this
    repository (--ops=libraries serves the default export in the test above): (export,
    lines, output lines, status). One batch: XLA compiles each batch and length shape once."""
    work = tmp_path_factory.mktemp("xla")
    compiled = export_model(model_dir, str(work / "export"), *DECODE_FLAGS, "--average_last=2",
                            "--decode_jit_compile", "--warmup_sentences=")
    texts = dev_sentences(20, start=40) + [""]
    got, status = clean_translate(compiled, ("\n".join(texts) + "\n").encode(), str(work),
                                  "--ops=tensorflow_text",
                                  "--refuse=keras_hub,keras_nlp,tf_transformer", "--batch_size=32")
    return compiled, texts, got, status


@pytest.mark.slow
def test_clean_process_with_tensorflow_text_imported(compiled_run, loaded):
    _, texts, got, status = compiled_run
    assert got == [t.decode() for t in serve_bytes(loaded, texts)]
    assert status["refused_imports"] == []  # keras is imported, by tensorflow_text itself
    assert not [m for m in status["loaded_modules"] if not m.startswith("keras")]


@pytest.mark.slow
def test_jit_compiled_export_translates_as_the_default_one(compiled_run, loaded):
    """--decode_jit_compile: the XLA search inside the SavedModel, in a clean process."""
    compiled, texts, got, _ = compiled_run
    with open(os.path.join(compiled, "assets", saved_model.METADATA_FILE)) as f:
        decode = json.load(f)["decode"]
    assert decode["jit_compile"] and decode["length_bucket"] == 16
    assert len(set(got)) > 10 and got[-1] == ""
    assert got == [t.decode() for t in serve_bytes(loaded, texts)]


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
