"""The C client (export/serving/c_client): built with the system compiler against the
tensorflow wheel's C API, it serves an export with no Python and translates as the
Python SavedModel does, line for line (the session export of conftest.py). Its errors on
names the signature lacks are checked on a stand-in SavedModel with the export's
signatures (names, dtypes, shapes) and trivial bodies: each run loads in a fraction of
the export's time."""

import os
import re
import shutil
import subprocess
import sys

import pytest
import tensorflow as tf
from model_fixtures import REPO_ROOT
from saved_model_fixtures import SIGNATURE_SPECS

from tf_transformer.exporters import warmup

CLIENT_DIR = os.path.join(REPO_ROOT, "export", "serving", "c_client")
TF_INCLUDE = os.path.join(os.path.dirname(tf.__file__), "include", "tensorflow", "c", "c_api.h")


@pytest.fixture(scope="module")
def client():
    if not shutil.which("gcc") or not shutil.which("make"):
        pytest.skip("gcc or make is not installed: the C client cannot be built")
    if not os.path.exists(TF_INCLUDE):
        pytest.skip(f"the tensorflow wheel has no C API headers ({TF_INCLUDE})")
    make = ["make", "-s", "-C", CLIENT_DIR, f"PY={sys.executable}"]
    build = subprocess.run(make, capture_output=True, text=True, timeout=600, check=False)
    assert build.returncode == 0, build.stdout + build.stderr
    ops = subprocess.run(make + ["ops-library"], capture_output=True, text=True, timeout=120, check=False)
    library = ops.stdout.strip()
    assert os.path.exists(library), ops.stdout + ops.stderr
    return os.path.join(CLIENT_DIR, "translate"), library


def _run(client, exported, data: bytes, *args):
    binary, library = client
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "1"}
    return subprocess.run([binary, f"--saved_model={exported}", f"--ops_library={library}", *args],
                          input=data, capture_output=True, env=env, timeout=300, check=False)


def _lines():
    """11 lines (batches of 4, 4, 3): dev sentences, an empty one, a CRLF ending, bad UTF-8."""
    dev = warmup.read_sentences(os.path.join(REPO_ROOT, "data", "libreoffice-help.en-de",
                                             "dev.tsv"))
    lines = [line.encode() for line in dev[:6] + ["", "Fonts und Farben"] + dev[200:202]]
    return lines + [b"bad \xff\xfe bytes \xc3"]


def _data(lines):
    return b"".join(line + (b"\r\n" if i == 7 else b"\n") for i, line in enumerate(lines))


@pytest.fixture(scope="module")
def default_run(client, exported):
    """The client on _lines() in batches of 4, default thread pools."""
    run = _run(client, exported, _data(_lines()), "--batch_size=4")
    assert run.returncode == 0, run.stderr.decode()[-3000:]
    return run


@pytest.mark.slow
def test_c_client_translates_as_the_python_saved_model(default_run, loaded):
    lines = _lines()
    got = default_run.stdout.split(b"\n")
    assert got[-1] == b"" and len(got) == len(lines) + 1
    expected = loaded.signatures["serving_default"](text=tf.constant(lines))["translation"]
    expected = [t.replace(b"\n", b" ") for t in expected.numpy()]
    assert got[:-1] == expected
    assert len(set(expected)) > 3 and expected[6] == b"" and expected[-1]
    timing = default_run.stderr.decode().splitlines()[-1]
    assert re.fullmatch(r"c_client load_seconds=\S+ batches=3 batch_size=4 sentences=11 "
                        r"seconds=\S+ first_batch_seconds=\S+ sentences_per_sec=[0-9.]+", timing)


def _stand_in_function(inputs: dict, outputs: dict) -> tf.function:
    """A function with the signature `inputs` -> `outputs` ({name: (dtype, shape)}, as
    SIGNATURE_SPECS): string outputs repeat the first input's strings (or are empty),
    the others are zeros; every None dimension is dynamic."""
    specs = [tf.TensorSpec(shape, dtype, name=name) for name, (dtype, shape) in inputs.items()]

    def body(*args):
        batch = tf.shape(args[0])[0]
        some = tf.minimum(batch, 1)  # a dynamic dimension
        out = {}
        for key, (dtype, shape) in outputs.items():
            dims = tf.stack([batch] + [some if d is None else d for d in shape[1:]])
            if dtype == tf.string and args[0].dtype == tf.string and len(shape) == 1:
                out[key] = tf.identity(args[0])
            else:
                out[key] = tf.fill(dims, tf.zeros([], dtype))
        return out

    return tf.function(body, input_signature=specs, autograph=False)


@pytest.fixture(scope="module")
def stand_in(client, tmp_path_factory):
    """A SavedModel with the export's signature_def entries (SIGNATURE_SPECS), trivial
    bodies: what the client reads names from, loaded in a fraction of the export's time.
    With the default names the client serves it (serving_default echoes its text)."""
    path = str(tmp_path_factory.mktemp("stand_in") / "1")
    signatures = {name: _stand_in_function(inputs, outputs)
                  for name, (inputs, outputs) in SIGNATURE_SPECS.items()}
    tf.saved_model.save(tf.Module(), path, signatures=signatures)
    run = _run(client, path, b"Fonts\n")
    assert run.returncode == 0 and run.stdout == b"Fonts\n", run.stderr.decode()[-3000:]
    return path


@pytest.mark.slow
@pytest.mark.parametrize("args,message", [
    (["--signature=nope"], b"no signature nope"),
    (["--output=nope"], b"the signature has no output 'nope'"),
    (["--input=nope"], b"the signature has no input 'nope'"),
    (["--output=score"], b"output is not a string tensor"),  # a real output, float32
])
def test_c_client_reads_names_from_the_signature_def(client, stand_in, args, message):
    run = _run(client, stand_in, b"Fonts\n", *args)
    assert run.returncode == 1 and message in run.stderr, run.stderr.decode()[-3000:]


@pytest.mark.slow
def test_c_client_thread_pools_keep_the_translations(client, exported, default_run):
    # The flags become a serialized ConfigProto (both fields): TF_SetConfig rejects a
    # malformed one, and 300 takes a two-byte varint. Thread counts change scheduling,
    # never the outputs.
    run = _run(client, exported, _data(_lines()), "--batch_size=4", "--intra_op_threads=1",
               "--inter_op_threads=300")
    assert run.returncode == 0, run.stderr.decode()[-3000:]
    assert run.stdout == default_run.stdout
